"""EAGLE3_DYNAMIC for sglang: EAGLE-3 speculation at small decode batches, plain decoding at large ones."""
