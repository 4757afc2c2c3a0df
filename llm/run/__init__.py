"""A whole run: the trainer loop, its monitors, the run directory and the trackers."""
