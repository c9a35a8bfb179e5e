"""TTL and retention sweeper (issue 4). Until then it only idles, so the stack's process layout is final."""
