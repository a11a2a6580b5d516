// One shared position across every pool and VM.
import { Picker } from "../../framework";

export const roundRobinPicker: Picker = {
  name: "round-robin",
  pick: (ctx, rows) => (ctx.state.next("RR") - 1) % rows.length,
};
