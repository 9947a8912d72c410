"""The worker process: processor, background loops, supervisor."""
