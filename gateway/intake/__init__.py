"""Request intake: reading, inflating and parsing bodies within bounds, checking client JSON Schemas, and the costly
work (checker processes, paced worker threads) that keeps large inputs off the event loop."""
