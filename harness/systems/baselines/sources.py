"""Megatron's and DeepSpeed's paper-scale settings in the simulator: what the paper states, and what the
model assumes where it states nothing (`harness sim report` prints them; the registry names them)."""

PAPER_D2 = "Yuan et al. 2022, App. D.2"
NOT_STATED = "not stated in the paper:"
DS = "DeepSpeed v0.6.7 (the paper's version)"

MEGATRON = (
    ("degrees", "best T x P x D in {1,2,4,8}^3 with T*P*D = 64", PAPER_D2),
    ("placement", "rank order, or the random layouts ours-random runs on",
     f"{PAPER_D2} (the random layouts only; the model also tries rank order)"),
    ("pipeline schedule", "1F1B, blocking point-to-point", f"{NOT_STATED} Megatron-LM's default (non-interleaved)"),
    ("micro-batch", "1 sample", f"{NOT_STATED} as the paper's own runs"),
    ("activation recompute", "on", f"{NOT_STATED} Megatron-LM's GPT examples (--checkpoint-activations)"),
    ("precision", "fp16 (V100 tensor cores)", "Yuan et al. 2022, sec. 4 (125 TFLOPS fp16 peak)"),
    ("workload", "GPT pre-training: GPT-2 vocabulary, LM head on the last stage", f"{NOT_STATED} Megatron-LM's GPT"),
    ("tied embedding", "the LM head is the word embedding (vocab-parallel); with a pipeline the first and last "
     "stage all-reduce its gradient after the data-parallel reduction", f"{NOT_STATED} Megatron-LM's GPT defaults "
     "(share_word_embeddings), training.py train_step (all-reduce over the embedding group)"),
    ("small collectives", "each micro-batch's loss all-reduced over the last stage's data-parallel group; before "
     "the step the found-inf flag and the gradient norm over each replica's model-parallel group (NCCL's binary "
     "tree, delays only)", "Megatron-LM pretrain_gpt.py loss_func (average_losses_across_data_parallel_group), "
     "optimizer/optimizer.py _unscale_main_grads_and_check_for_nan, optimizer/clip_grads.py (clip_grad 1.0 "
     "default); NCCL 2.8.4 graph/trees.cc"),
)
DEEPSPEED = (
    ("configurations", "ZeRO-3 alone, or ZeRO-1 + pipeline (P in {1,2,4,8}); the better",
     f"{PAPER_D2} (DeepSpeed 0.6.7 combines only ZeRO-1 with its pipeline)"),
    ("ZeRO-3 gathers", "a module's parameters gathered unless still live: kept while the module is used again "
     "within 1e9 parameters' worth of modules; the next module's prefetched behind compute",
     f"{NOT_STATED} {DS} defaults: stage3_max_reuse_distance 1e9, stage3_prefetch_bucket_size 5e7 "
     "(runtime/zero/constants.py, partitioned_param_coordinator.py)"),
    ("ZeRO-3 gradients", "reduce-scattered in every micro-batch's backward", f"{DS} runtime/zero/stage3.py "
     "(gradients partitioned as each backward produces them)"),
    ("ZeRO-1 + pipeline: tied embedding", "the word embedding tied to the LM head (first and last stage); its "
     "gradient all-reduced by the two holders of each replica before the data-parallel reduction",
     f"{NOT_STATED} {DS} runtime/pipe/schedule.py TrainSchedule (ReduceTiedGrads, ReduceGrads, OptimizerStep), "
     "pipe/module.py allreduce_tied_weight_gradients; the GPT pipe models tie it (TiedLayerSpec)"),
    ("ZeRO-3 micro-batch", "the largest power of two that fits a device (partitioned states, at most 1e9 live "
     "parameters, the 5e8-element gradient bucket, one micro-batch's checkpointed activations and logits) and "
     "divides its samples: 8 for GPT3-XL on 16 GB", f"{NOT_STATED} ZeRO-S3 ran 'under the same settings' "
     f"({PAPER_D2}); {DS} defaults stage3_max_live_parameters, reduce_bucket_size (runtime/zero/constants.py); "
     "harness/systems/deepspeed/zero3.py"),
    ("ZeRO-1 + pipeline: stages", "layers split by parameters (embedding and tied head counted on their stages): "
     "GPT3-XL L24 over 8 stages 1, 4, 4, 4, 4, 4, 3 blocks and the head alone",
     f"{NOT_STATED} {DS} PipelineModule default partition_method='parameters', runtime/utils.py partition_balanced; "
     "harness/systems/deepspeed/partition.py"),
    ("ZeRO-1 + pipeline: gradients", "reduced to each partition's owner in turn, one NCCL ring reduce a "
     "partition (a chain storing and forwarding 512 KiB pieces), then the owners' updated parameters all-gathered",
     f"{DS} runtime/zero/stage_1_and_2.py average_tensor (reduce_scatter default true: dist.reduce per "
     "partition), all_gather_dp_groups; NCCL 2.8.4 collectives/device/reduce.h; the two 5e8-element buckets' "
     "boundary, which splits one partition's reduce in two, is not modelled"),
    ("small collectives", "ZeRO-1 + pipeline: the overflow flag and the gradient norm over the data-parallel "
     "group, then the replica's stages; the loss all-reduced on the last stage, broadcast to the rest. ZeRO-3: "
     "the flag and the norm over every device", f"{DS} runtime/zero/stage_1_and_2.py and stage3.py has_overflow, "
     "get_grad_norm_direct; runtime/pipe/engine.py _aggregate_total_loss; NCCL 2.8.4 graph/trees.cc"),
    ("ZeRO-1 + pipeline: point-to-point", "blocking send and receive in instruction order, no rendezvous charged",
     f"{DS} runtime/pipe/p2p.py: torch.distributed send/recv from torch 1.8 (two-rank broadcasts only before); "
     "over NCCL's socket transport a send completes once its socket takes the data (see dtfm's NCCL row)"),
    ("micro-batch, recompute, precision, workload", "ZeRO-1 + pipeline 1 sample; on, fp16, GPT with an LM head",
     f"{NOT_STATED} as Megatron's"),
)
