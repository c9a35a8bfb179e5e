"""Erasure on the client's side (docs/security.md, "Erasure"): what a writer hashes and seals so that
destroying one key makes a subject's events unreadable everywhere, for good.

- `subjects`: whose data an event carries (a thread, a store namespace prefix) and the keyed hashes
  that stand for identifiers in the log;
- `sealing`: an event's payload sealed with its subject's data key (AES-256-GCM), and opened again;
- `sealer`: events made ready for the log in one process, with the keys fetched once and cached;
- `read_api_keys`: where a client's keys come from (the read API's `POST /v1/keys`);
- `fresh_keys`: data keys a client holds ahead of use, so a new subject's first write waits on none.

"Key" means one of these, and names here say which:
- record key: the Kafka record's key, a hash of the thread id (or of a store item's namespace and
  key) that keeps one thread's (one item's) events on one partition, in order;
- item key: a store item's own key, as LangGraph's `BaseStore` names it;
- hashing key: a tenant's HMAC key, from which record keys and subject references are made;
- data key: the AES key one subject's events are sealed with (a fresh data key: one issued to a
  tenant ahead of use, bound to a subject by its first record);
- key id: the name of a fresh data key in a sealed payload.
Key-encryption keys, which wrap hashing and data keys at rest, live only in the services' key store.
"""
