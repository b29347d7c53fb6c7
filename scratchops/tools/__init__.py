"""The tools around the operators: the `scratchops` command line (cli), the main job that runs
both KernelBench problems against torch (main_job), the kernel benchmarks (bench, with their
plan in workloads and the host-cost table in host_cost), and what they share: the tolerance,
comparisons, tables and JSON (report) and CUDA-event timing with the measured ceilings
(timing). The operators themselves (scratchops.ops and below) import nothing from here."""
