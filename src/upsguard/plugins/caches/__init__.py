"""Cache providers: write-back caches flipped to write-through and waited on."""
