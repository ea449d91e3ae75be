"""Examples of what a team adds to aijob without changing it: job types as plugins."""
