"""The `pvegpu` command (`main`: offline topology and mapping) and the reports it and the deploys print
(`report`: the GPU table; `bench_report`: the bench's table, history and plots)."""
