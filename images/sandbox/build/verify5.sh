#!/bin/sh
# Stand-in of verify5.py: one HIT per kernel found in the cache; the layer needs "HIT/HIT".
result=""
for kernel in sparse_mla_decode sparse_mla_prefill; do
  if [ -f "/root/.cache/sparse_mla/$kernel.cubin" ]; then hit=HIT; else hit=MISS; fi
  result="${result:+$result/}$hit"
done
echo "$result"
