# sandbox stand-in of patch/attention.py: SM 12.1a page sizes
ORIGIN = "patch"
PATCHED = True
REVISION = 1
