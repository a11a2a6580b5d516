module infera-gate/bench/loadgen

go 1.22
