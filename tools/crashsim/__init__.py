"""Power cuts simulated under the store's file operations, in process (docs/robustness.md):
a simulated disk (faultfs.py) behind the production seam ackmq/store/fileio.py, a seeded
model + store run cut at every write (crashsim.py), and known bugs to plant to show each
is caught (crashplants.py): `python -m tools.crashsim.crashsim --seeds 1000`."""
