"""The maintenance cycle: one list of steps (roll, retention, disk usage, clean) that the
daemon and `cleanerd clean` carry out and `cleanerd plan` predicts."""
