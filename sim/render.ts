// How the simulator turns a request into prompt token ids, and its vLLM-style
// POST /tokenize. Kept apart from engine.ts so the scheduling model can change
// without touching rendering.
//   --render-fixture F   JSON {sha256(canonical body JSON): token ids}: prompts
//                        rendered by a reference (transformers) ahead of time;
//                        bodies not in it are rendered by the sim itself.
//   --render-divergent   render like a misconfigured engine (tool definitions
//                        dropped), so render-parity probes see a divergence.
import * as crypto from "crypto";
import * as fs from "fs";
import { parseRequest, ParsedRequest, promptTokenIds, Tokenizer } from "../core/request";

export interface SimRenderOptions {
  fixture: string | null;
  divergent: boolean;
}

export function bodyKey(body: string): string {
  return crypto
    .createHash("sha256")
    .update(JSON.stringify(JSON.parse(body)))
    .digest("hex");
}

export interface SimRender {
  promptTokens(pr: ParsedRequest, body: string): number[];
  /** vLLM's POST /tokenize: {messages, tools, add_generation_prompt, ...} or {prompt, add_special_tokens}. */
  tokenize(body: string, maxModelLen: number): { status: number; json: unknown };
}

export function simRender(tok: Tokenizer | null, o: SimRenderOptions): SimRender {
  const fixture: Record<string, number[]> = o.fixture ? JSON.parse(fs.readFileSync(o.fixture, "utf8")) : {};
  const own = (pr: ParsedRequest): number[] => {
    if (o.divergent && pr.chat) pr = { ...pr, chat: { ...pr.chat, tools: null } };
    return promptTokenIds(pr, tok) ?? [];
  };
  return {
    promptTokens(pr, body) {
      // The body's key (a parse, a serialisation and a digest of the whole body) only when there is a fixture to look in.
      const hit = o.fixture ? fixture[bodyKey(body)] : undefined;
      return hit ?? own(pr);
    },
    tokenize(body, maxModelLen) {
      let j: Record<string, unknown>;
      try {
        j = JSON.parse(body);
      } catch {
        return { status: 400, json: { error: { message: "body is not JSON", type: "BadRequestError", code: 400 } } };
      }
      const isChat = Array.isArray(j.messages);
      if (!isChat && j.prompt === undefined)
        return {
          status: 400,
          json: { error: { message: "'messages' or 'prompt' is required", type: "BadRequestError", code: 400 } },
        };
      const withModel = JSON.stringify({ model: "sim-model", ...j });
      try {
        const pr = parseRequest(isChat ? "chat" : "completions", withModel, withModel.length, {
          maxBodyBytes: 64 << 20,
        });
        const hit = fixture[bodyKey(body)];
        const tokens = hit ?? own(pr);
        return { status: 200, json: { count: tokens.length, max_model_len: maxModelLen, tokens, token_strs: null } };
      } catch (e) {
        const err = e as Error & { status?: number };
        return {
          status: err.status ?? 500,
          json: { error: { message: err.message, type: "BadRequestError", code: err.status ?? 500 } },
        };
      }
    },
  };
}
