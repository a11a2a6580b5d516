// The /metrics reader (runtime/engine-metrics.ts) on pages in the engines'
// documented shapes. Sources:
//   vLLM: the "Production Metrics" page (docs.vllm.ai, serving/metrics: series
//     named vllm:..., labelled model_name, values as floats) and
//     vllm/v1/metrics/loggers.py, where vllm:cache_config_info is an info gauge
//     of value 1 whose labels are every CacheConfig field stringified
//     (CacheConfig.metrics_info), so num_gpu_blocks reads "None" until the
//     engine has profiled its memory.
//   SGLang: the "Production Metrics" page (docs.sglang.io, references/
//     production_metrics: the curl example, sglang:token_usage 0.28 and its
//     HELP/TYPE lines) and python/sglang/srt/observability/metrics_collector.py
//     for sglang:max_total_num_tokens, num_queue_reqs, num_running_reqs and
//     cache_config_info{page_size,num_pages}. SGLang's gRPC mode serves the
//     same series through the multiprocess collector as sglang_... (smg PR 813's
//     example output).
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { parsePrometheusText, readEngineFigures } from "../../runtime/engine-metrics";

const VLLM = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.4125
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="27153",prefix_caching_hash_algo="sha256",sliding_window="None",swap_space="4",swap_space_bytes="4294967296"} 1.0
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
`;

const SGLANG = `# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:cache_hit_rate The cache hit rate
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.007507552643049313
# HELP sglang:num_running_reqs The number of running requests
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 11.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="meta-llama/Llama-3.1-8B-Instruct"} 471258.0
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.3518979474117756e+06
sglang:time_to_first_token_seconds_bucket{le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
`;

test("vLLM's page: capacity = num_gpu_blocks x block_size, usage 0..1, queue and batch", () => {
  const f = readEngineFigures(parsePrometheusText(VLLM));
  assert.deepEqual(f, {
    engine: "vllm",
    capacityTokens: 27153 * 16,
    kvUsage: 0.4125,
    waitingRequests: 2,
    runningRequests: 3,
  });
  // Before profiling num_gpu_blocks is "None": no capacity yet, the rest still read.
  const early = readEngineFigures(parsePrometheusText(VLLM.replace('num_gpu_blocks="27153"', 'num_gpu_blocks="None"')));
  assert.equal(early.capacityTokens, null);
  assert.equal(early.kvUsage, 0.4125);
  // The name before 0.9 still reads when the new one is absent.
  const old = readEngineFigures(
    parsePrometheusText(VLLM.replace(/vllm:kv_cache_usage_perc/g, "vllm:gpu_cache_usage_perc")),
  );
  assert.equal(old.kvUsage, 0.4125);
});

test("SGLang's page: capacity from max_total_num_tokens, else cache_config_info or the page gauges", () => {
  assert.deepEqual(readEngineFigures(parsePrometheusText(SGLANG)), {
    engine: "sglang",
    capacityTokens: 471258,
    kvUsage: 0.28,
    waitingRequests: 4,
    runningRequests: 11,
  });
  const noMax = SGLANG.split("\n")
    .filter((l) => !l.includes("max_total_num_tokens"))
    .join("\n");
  const info = noMax + `sglang:cache_config_info{model_name="m",num_pages="29453",page_size="16"} 1\n`;
  assert.equal(readEngineFigures(parsePrometheusText(info)).capacityTokens, 29453 * 16);
  const gauges = noMax + "sglang:num_pages 1000\nsglang:page_size 64\n";
  assert.equal(readEngineFigures(parsePrometheusText(gauges)).capacityTokens, 64000);
  // The multiprocess collector's spelling (sglang_...) reads the same.
  const underscored = readEngineFigures(parsePrometheusText(SGLANG.replace(/sglang:/g, "sglang_")));
  assert.equal(underscored.engine, "sglang");
  assert.equal(underscored.capacityTokens, 471258);
  assert.equal(underscored.waitingRequests, 4);
});

test("several series: a DP rank reads its own (engine label), others the largest value", () => {
  const two =
    'vllm:num_requests_waiting{engine="0",model_name="m"} 5\n' +
    'vllm:num_requests_waiting{engine="1",model_name="m"} 1\n' +
    'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.9\n' +
    'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.2\n';
  const s = parsePrometheusText(two);
  assert.equal(readEngineFigures(s, 1).waitingRequests, 1);
  assert.equal(readEngineFigures(s, 1).kvUsage, 0.2);
  assert.equal(readEngineFigures(s, 0).waitingRequests, 5);
  assert.equal(readEngineFigures(s).waitingRequests, 5);
});

test("the text parser: escapes in label values, timestamps, junk lines, no engine at all", () => {
  const s = parsePrometheusText(
    'a{x="q\\"uote",y="back\\\\slash"} 1 1700000000000\n' +
      "broken{x=1} 2\n" +
      "b 2.5e3\n" +
      "c{} NaNish\n" +
      "\n# comment\n",
  );
  assert.deepEqual(s, [
    { name: "a", labels: { x: 'q"uote', y: "back\\slash" }, value: 1 },
    { name: "b", labels: {}, value: 2500 },
  ]);
  assert.deepEqual(readEngineFigures(s), {
    engine: null,
    capacityTokens: null,
    kvUsage: null,
    waitingRequests: null,
    runningRequests: null,
  });
});
