import { Picker } from "../../framework";

export const randomPicker: Picker = {
  name: "random",
  pick: (ctx, rows) => Math.min(rows.length - 1, Math.floor(ctx.random() * rows.length)),
};
