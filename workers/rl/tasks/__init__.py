"""A run's tasks: the task set, the scheduler that draws the next, and their overlap with eval suites."""
