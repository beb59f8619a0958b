"""The compiled twins of the pool and the LRU stack (C extensions built at install) and their loader."""
