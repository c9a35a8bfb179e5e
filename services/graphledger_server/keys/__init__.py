"""The key store: data keys of erasure subjects and tenants' hashing keys, wrapped by a key-encryption
key, in a schema of their own that rebuilds and replays never touch (docs/security.md)."""
