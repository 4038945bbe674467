// What every JS client test shares: where the horde is (the env the pytest wrapper sets) and the pacing that
// keeps one test file's requests under the horde's per-address and per-key limit of 2 chat requests a second, so
// the files also pass against `make run`'s stack, where the limits are on (the pytest stack turns them off):
//
//   cd tests/clients/js && HORDE_FRONT_URL=http://127.0.0.1:7000/v1 HORDE_API_KEY=<key> \
//     HORDE_MODEL=scripted/echo node --test --test-concurrency=1
import { setTimeout as sleep } from "node:timers/promises";

function required(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (tests/clients/test_js_clients.py sets it)`);
  return value;
}

/** The OpenAI-compatible base URL, e.g. http://127.0.0.1:7000/v1. */
export const FRONT_URL = required("HORDE_FRONT_URL");
/** The demo user's API key (sent as Authorization: Bearer). */
export const API_KEY = required("HORDE_API_KEY");
/** The scripted worker's model, scripted/echo. */
export const MODEL = required("HORDE_MODEL");
/** The scripted backend's reply prefix (worker/src/horde_worker/backends/scripted.py GREETING). */
export const GREETING = "Hello from the scripted backend:";

/** Wait before each request: at most two a second from this address and key (the horde's default limits). */
export function pace() {
  return sleep(600);
}
