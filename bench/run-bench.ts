// The exit path of a bench that starts processes through the test harness.
import { stopAll } from "../test/harness";

/** Runs a bench's main: exit 0 when it ends; on an error, print it, stop what the harness started, exit 1. */
export function runBench(main: () => Promise<void>): void {
  main().then(
    () => process.exit(0),
    async (e) => {
      console.error(e);
      await stopAll();
      process.exit(1);
    },
  );
}
