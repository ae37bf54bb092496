# sandbox stand-in of patch/engram.py: Engram-on-disk, rank-offset fix
ORIGIN = "patch"
PATCHED = True
REVISION = 1
