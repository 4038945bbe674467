"""The horde-wide modes (maintenance, invite-only, raid): one row of ``horde_modes`` (migration 0003).

Upstream keeps these in its settings; here they are durable rows an operator switches with ``horde-admin
modes`` and every service reads. ``GET /v2/status/modes`` reports them; admission refuses new requests while
``maintenance`` is on (docs/native-api.md#text-route processing order).
"""

from __future__ import annotations

from dataclasses import dataclass

from horde_store.db import ConnOrPool


@dataclass(frozen=True)
class HordeModes:
    """The modes as stored: each false unless an operator switched it on."""

    maintenance: bool = False
    invite_only: bool = False
    raid: bool = False


async def read_modes(conn: ConnOrPool) -> HordeModes:
    """The current modes (one primary-key read; all off when the row is missing)."""
    row = await conn.fetchrow("SELECT maintenance, invite_only, raid FROM horde_modes WHERE id = 1")
    if row is None:
        return HordeModes()
    return HordeModes(
        maintenance=bool(row["maintenance"]), invite_only=bool(row["invite_only"]), raid=bool(row["raid"])
    )
