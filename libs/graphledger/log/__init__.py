"""The log as a reader meets it, below the client and the services: where a partition ends and its records
(`tail`), the Kafka requests behind that (`requests`), the recorded partition layout (`layout`), bounded
decompression (`compressed_batches`), offsets a fetch passed over (`gaps`), and the key filter (`key_filter`)."""
