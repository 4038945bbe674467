"""Generated gRPC contracts of Horde Chat (see proto/horde/*/v1/*.proto)."""
