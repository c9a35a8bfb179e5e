"""The log, as the services meet it: its topics (`topics`), the one way to build a Kafka client
(`clients`), and how far each consumer group applied it (`offsets`, the `graphledger_offsets` table;
`applied`, a process's live view of it)."""
