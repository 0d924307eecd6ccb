#!/usr/bin/env bash
# DeepSeek-V4 prefill and decode on one 16-GPU node, then the router.
#
# Broken on purpose: the decode's transfer backend is NIXL, the prefill's Mooncake
# (check: DSV4G023, the transfer backends differ).
set -euo pipefail

export MODEL=/models/DeepSeek-V4
export SGLANG_DISAGGREGATION_THREAD_POOL_SIZE=8
COMMON="--model-path $MODEL --trust-remote-code --tp-size 8
  --speculative-algorithm EAGLE --speculative-num-steps 3
  --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"

# prefill: GPUs 0-7
CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 python3 -m sglang.launch_server $COMMON \
  --disaggregation-mode prefill \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-bootstrap-port 8998 \
  --port 30000 > prefill.log 2>&1 &

# decode: GPUs 8-15
CUDA_VISIBLE_DEVICES=8,9,10,11,12,13,14,15 python3 -m sglang.launch_server $COMMON \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend nixl \
  --port 30001 > decode.log 2>&1 &

python3 -m sglang_router.launch_router --pd-disaggregation \
  --prefill http://127.0.0.1:30000 8998 \
  --decode http://127.0.0.1:30001 \
  --host 0.0.0.0 --port 8000
