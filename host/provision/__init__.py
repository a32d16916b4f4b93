"""Getting boards ready: virtual boards started for a run (the cluster), flashing a board with the
node, and deployment keys."""
