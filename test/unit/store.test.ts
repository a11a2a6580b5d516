import { test } from "node:test";
import * as assert from "node:assert/strict";
import { memStore } from "../../core/store";

test("memStore: separate string/number namespaces, prefix keys via the bucket index and by scan", () => {
  const st = memStore();
  st.set("MR:w#1:a", "x");
  st.incr("MR:w#1:b", 2);
  st.incr("MR:w#2:c", 1);
  st.set("M:abc", "w#1");
  st.set("MS:w#1", "3");
  assert.deepEqual(st.keys("MR:w#1:").sort(), ["MR:w#1:a", "MR:w#1:b"]);
  assert.deepEqual(st.keys("MR:").sort(), ["MR:w#1:a", "MR:w#1:b", "MR:w#2:c"]);
  assert.deepEqual(st.keys("M:"), ["M:abc"]);
  st.delNum("MR:w#1:b");
  st.del("MR:w#1:a");
  assert.deepEqual(st.keys("MR:w#1:"), []);
  assert.equal(st.get("MR:w#1:a"), undefined);
  assert.equal(st.num("MR:w#1:b"), 0);
  assert.equal(st.incr("k", 5), 5);
  assert.equal(st.incr("k", -2), 3);
  st.set("both:x:y", "s");
  st.incr("both:x:y", 1);
  st.del("both:x:y");
  assert.deepEqual(st.keys("both:x:"), ["both:x:y"], "still there as a number");
  st.delNum("both:x:y");
  assert.deepEqual(st.keys("both:x:"), []);
});
