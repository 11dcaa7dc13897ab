"""Speed settings measured on this machine: `localrun tune` and its wisdom.

- `measure`: the measurements (`tune`), within a time cap.
- `wisdom`: what they found, per machine, model and KV types, in the cache.
- `apply`: every default that depends on speed reads it (`apply.apply`).
- `race`: interleaved repeated measurement, decided beyond noise or a tie.
- `machine`: what makes a measurement this machine's.
"""
