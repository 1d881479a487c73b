"""The Files and Batch APIs, and the runner that works through batches on idle capacity."""
