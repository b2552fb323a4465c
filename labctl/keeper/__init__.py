"""The keeper: a per-user background process that holds an inventory's SSH connections for a
while after the last command (issue 41).

- `sock`: where its Unix socket lives (a 0700 folder the user owns), the frame protocol, and
  the peer check (SO_PEERCRED) both ends make.
- `server`: the process itself. One per inventory file; it exits when idle for
  `connections.persist`, when the inventory file disappears, and when asked (`stop`).
- `client`: what a command uses: `KeptConnection` (a transport.base.Connection that forwards
  to the keeper), `kept_connection` (None when the keeper is not there or not willing: the
  command connects itself), `spawn`, `list_connections`, `close_connections`, `stop`.

Nothing secret is written to disk: the folder holds the socket and a lock file only.
"""
