"""The live shared KV level: the store process (``service``) holding one ``SharedStore``, and a
replica's side of it (``mirror``: the synchronous stand-in its ``TierStack`` runs on; ``client``: the async
layer that follows the store's feed and ships writes and reads to it)."""
