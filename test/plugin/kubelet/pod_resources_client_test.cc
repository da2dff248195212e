// Unit tests: to be written.
