"""Records opened into events as the projector applies them: the one opener of the projector's batches, a
replay's and the read API's read-through.

Opening a batch of records, in order (`open`):
1. load the data keys their `gl-subject` and `gl-key` headers name (`keys/lookup.py`);
2. decode, unseal and validate each record (`graphledger.opening.records.classify`, with the topic's
   validation: `checkpoint_events.py`, `store_events.py`), and admit it by its seal and its key's owner
   (`graphledger.opening.admission`);
3. bind the fresh keys records opened with to their subjects, outside any transaction, and classify again
   the records whose key turned out to be another subject's (`binding.py`).
A chunked event opens once its chunks are together (`reassembled`), wherever its reader keeps the earlier
ones: the projector in its chunk table (`chunk_table.py`), a read in the records it holds. Every reader
opens a record to the same outcome, so what a read folds is what the projector applies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from graphledger.log.records import LogRecord
from graphledger.opening import chunks
from graphledger.opening.admission import admitted
from graphledger.opening.records import Chunk, Classified, DeadLetter, Opened, ToEvent, classify, decode_value, key_name
from graphledger_server.keys.lookup import DataKeyCache
from graphledger_server.opening.binding import bind_opened


class RecordOpener:
    """Opens records with one key cache and one validation per topic."""

    def __init__(self, keys: DataKeyCache, to_event: Callable[[str], ToEvent], *, clear_refused: bool = False) -> None:
        self.keys = keys
        """The data keys sealed events open with (`DataKeyCache(None)`: no sealed event opens)."""
        self.to_event = to_event
        """The topic's validation of an envelope into a typed event (`ToEvent`)."""
        self.clear_refused = clear_refused
        """Encryption is on and the log has no clear era: events of a thread or namespace in the clear are
        dead-lettered (`admission.in_the_clear`)."""

    async def open(self, records: Sequence[LogRecord]) -> list[Classified]:
        """Every record classified and admitted, once the keys they name are loaded and the fresh keys they
        opened with are bound (steps 1 to 3). Raises what the key store raises."""
        await self.keys.load({name for r in records if (name := key_name(r)) is not None})
        return await bind_opened([self.classify(r) for r in records], self.keys, lambda i: self.classify(records[i]))

    def classify(self, record: LogRecord) -> Classified:
        """One record, with the keys loaded so far (step 2)."""
        found = classify(record, self.to_event(record.topic), self.keys.get)
        return admitted(found, self.keys.owner, clear_refused=self.clear_refused)

    def reassembled(self, last: Chunk, parts: Mapping[int, bytes]) -> Opened:
        """The event `last` completes, from the bytes of its chunks by index (`last`'s own taken from its
        record where `parts` lacks it), at `last`'s position. A fresh key it opened with is not bound here:
        `reassembled_and_bound`, or the caller binds it (the projector, after its transaction)."""
        record, ref = last.record, last.ref
        value = chunks.assemble({ref.index: record.value or b"", **parts}, ref.count)
        if value is None:
            return DeadLetter(record, f"chunks of event {ref.event_id} do not cover 0..{ref.count - 1}", None, None,
                              ref.event_id)  # fmt: skip
        found = decode_value(record, value, self.to_event(record.topic), self.keys.get, chunk_event_id=ref.event_id)
        return admitted(found, self.keys.owner, clear_refused=self.clear_refused)

    async def reassembled_and_bound(self, last: Chunk, parts: Mapping[int, bytes]) -> Opened:
        """`reassembled`, once the fresh key it opened with is bound (step 3). Raises what the key store raises."""
        return (await bind_opened([self.reassembled(last, parts)], self.keys, lambda _: self.reassembled(last, parts)))[
            0
        ]
