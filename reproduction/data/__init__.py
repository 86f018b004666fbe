"""LeRobot v2.1 and v3.0 datasets read and written with pyarrow; dataset fingerprints."""
