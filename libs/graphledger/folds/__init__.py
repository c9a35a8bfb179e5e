"""The folds of a key's events into what its reads answer, written once with the projection's rules:
a thread's checkpoint events (`thread`) and a store item's events (`store_item`)."""
