"""The run history: every generate, chat turn, batch line and server request
in an SQLite database (db.py), written by the recorder a command feeds
(record.py), and read back by `localrun logs` (query.py)."""
