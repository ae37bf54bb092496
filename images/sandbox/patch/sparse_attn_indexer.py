# sandbox stand-in of patch/sparse_attn_indexer.py: SM 12.1a top_k_per_row_decode
ORIGIN = "patch"
PATCHED = True
REVISION = 1
