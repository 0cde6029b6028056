"""Language-model data: documents (the Python standard library's own source, or a folder of .txt/.jsonl files), a
byte-level BPE tokenizer trained on them once and cached, the models by name (transformers decoders from a
config, random weights), and the batches: padded to the longest document, packed without padding, or drawn from
documents of similar length."""
