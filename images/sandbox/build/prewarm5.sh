#!/bin/sh
# Stand-in of prewarm5.py: fills the kernel cache that verify5 then finds (the TP4 vLLM report Appendix A.4).
set -e
mkdir -p /root/.cache/sparse_mla
for kernel in sparse_mla_decode sparse_mla_prefill; do
  echo "compiled $kernel for sm_121a" > "/root/.cache/sparse_mla/$kernel.cubin"
done
