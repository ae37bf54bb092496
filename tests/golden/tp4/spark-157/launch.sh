#!/bin/sh
# sparkctl render: start the engine of profile tp4 on spark-157 (rank 2 of 4, worker).
# This directory belongs at /var/lib/sparkctl/tp4/ on spark-157: docker reads /var/lib/sparkctl/tp4/engine.env.
# Same container as compose.yaml. A container named sparkctl-tp4 must not exist yet
# (remove an old one with: docker rm -f sparkctl-tp4).
set -eu
docker run -d \
    --restart on-failure \
    --name sparkctl-tp4 \
    --network host \
    --ipc host \
    --gpus all \
    --ulimit nofile=1048576:1048576 \
    --ulimit memlock=-1:-1 \
    --ulimit stack=67108864:67108864 \
    --cap-add IPC_LOCK \
    --device /dev/infiniband \
    --memory 112g \
    --env-file /var/lib/sparkctl/tp4/engine.env \
    -v /mnt/nvme/models/DeepSeek-V4.1-Flash:/model:ro \
    -v /mnt/nvme/engram:/engram \
    -v /mnt/nvme/hf-cache:/root/.cache/huggingface \
    --label sparkctl.profile=tp4 \
    --label sparkctl.rank=2 \
    vllm-dsv41:latest \
    vllm serve /model \
        --served-model-name deepseek-v4.1-flash \
        --host 0.0.0.0 \
        --port 8000 \
        --tensor-parallel-size 4 \
        --nnodes 4 \
        --node-rank 2 \
        --master-addr 10.10.10.153 \
        --master-port 29500 \
        --headless \
        --gpu-memory-utilization 0.8 \
        --max-model-len 300000 \
        --max-num-seqs 8 \
        --max-num-batched-tokens 8192 \
        --block-size 128 \
        --distributed-executor-backend mp \
        --speculative-config '{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic","rejection_sample_method":"block","enable_adaptive_verification":false}' \
        --compilation-config '{"cudagraph_mode":"FULL_AND_PIECEWISE"}' \
        --default-chat-template-kwargs '{"thinking":false}' \
        --tool-call-parser deepseek_v41 \
        --enable-auto-tool-choice \
        --reasoning-parser deepseek_v41 \
        --limit-mm-per-prompt '{"image":4}'
