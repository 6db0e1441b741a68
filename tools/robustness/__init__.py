"""Hostile input and failure against a live broker (docs/robustness.md, SPEC B1-B3):
mutation fuzzers (fuzz.py, fuzz_listeners.py, fuzz_seeds.py), malformed frames
(frame_probe.py), connection and memory abuse (conns.py, flood.py), a long kill -9 soak
(soak.py) and power loss on LazyFS (powerloss.py)."""
