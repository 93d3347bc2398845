"""The stages of models/train_tiny_pair.py: corpus, tokenizer, target, draft, evaluation, export."""
