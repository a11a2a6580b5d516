// What reaches the chat template, reproduced from vLLM's OpenAI and Anthropic
// front ends so the router hashes the prompt the engine caches. Pure and
// njs-safe (no class/Map/Set/spread/for-of): the njs bundle uses it too.
//
// Rules (vLLM entrypoints/chat_utils.py, anthropic/serving.py, HF transformers
// apply_chat_template), see docs/rendering.md:
// - whole messages reach the template: role, content, tool_calls, tool_call_id,
//   name, reasoning (+ reasoning_content alias), task, developer tools;
// - content: null -> no parts; string -> one text part; for "string" content
//   format templates the text parts are joined with "\n" and media parts become
//   model placeholders in front; for "openai" format templates (those that loop
//   over message content) parts stay a list of {type:text,text} / {type:image} ...;
// - tool-call arguments are JSON-parsed before templating ({} when not JSON);
// - request tools are normalized like vLLM's pydantic model_dump
//   ({type, function:{name, description, parameters, ...extras}});
// - chat_template_kwargs override the request-level template variables.
import { httpError } from "./util";
import { cloneJson, parseJson, stringifyJson } from "./json";
import { renderTemplate } from "./jinja";

export type ContentFormat = "string" | "openai";

/** A chat request as the engine's template layer sees it, before content-format processing. */
export interface ChatInput {
  /** OpenAI-shape messages (Anthropic requests already converted). */
  messages: any[];
  tools: any[] | null;
  documents: any[] | null;
  addGenerationPrompt: boolean;
  continueFinalMessage: boolean;
  reasoningEffort: any;
  /** chat_template_kwargs from the request. */
  kwargs: { [k: string]: any };
}

function isObj(v: unknown): v is { [k: string]: any } {
  return typeof v === "object" && v !== null && !(v instanceof Array);
}

/**
 * vLLM decides per template whether message content is a string or a list of
 * parts: a template that loops over a message's content gets parts.
 */
export function detectContentFormat(template: string | null): ContentFormat {
  if (!template) return "string";
  // Loop variables bound to the message list (messages, loop_messages, messages[1:] ...).
  const msgVars: { [k: string]: boolean } = {};
  const forRe = /\{%-?\s*for\s+(\w+)\s+in\s+(\w+)/g;
  let m: RegExpExecArray | null;
  while ((m = forRe.exec(template))) if (/messages/.test(m[2])) msgVars[m[1]] = true;
  const contentLoop =
    /\{%-?\s*for\s+\w+(?:\s*,\s*\w+)?\s+in\s+(\w+)\s*(?:\[\s*['"]content['"]\s*\]|\.content)\s*(?:-?%\}|\|)/g;
  while ((m = contentLoop.exec(template))) if (msgVars[m[1]]) return "openai";
  return "string";
}

const PLACEHOLDER_KEYS: { [modality: string]: string } = {
  image: "<##IMAGE##>",
  audio: "<##AUDIO##>",
  video: "<##VIDEO##>",
};

function partModality(type: string): string | null {
  if (type === "image_url" || type === "input_image" || type === "image_embeds" || type === "image_pil") return "image";
  if (type === "audio_url" || type === "input_audio" || type === "audio_embeds") return "audio";
  if (type === "video_url") return "video";
  return null;
}

/** Type of a part without 'type', the way vLLM infers it from the key present. */
function inferType(p: { [k: string]: any }): string {
  const keys = [
    "image_url",
    "image_pil",
    "image_embeds",
    "audio_embeds",
    "audio_url",
    "input_audio",
    "video_url",
    "tool_reference",
  ];
  for (let i = 0; i < keys.length; i++) if (p[keys[i]] !== undefined && p[keys[i]] !== null) return keys[i];
  throw httpError(400, "content part has no 'type'");
}

export interface RenderOptions {
  format: ContentFormat;
  /** Model placeholder per modality for string-format templates, e.g. {image: "<|vision_start|><|image_pad|><|vision_end|>"}. */
  placeholders?: { [modality: string]: string };
}

function parseParts(_role: string, content: any, opts: RenderOptions, where: string): any {
  let parts: any[];
  if (content === null || content === undefined) parts = [];
  else if (typeof content === "string") parts = [{ type: "text", text: content }];
  else if (content instanceof Array) parts = content;
  else throw httpError(400, where + ".content must be a string, null or an array of parts");
  const wrap = opts.format === "openai";
  const out: any[] = [];
  const media: string[] = [];
  for (let i = 0; i < parts.length; i++) {
    const p = parts[i];
    if (typeof p === "string") {
      out.push(wrap ? { type: "text", text: p } : p);
      continue;
    }
    if (!isObj(p)) throw httpError(400, where + ".content[" + i + "] must be an object");
    const type = typeof p.type === "string" && p.uuid === undefined ? p.type : inferType(p);
    if (
      type === "text" ||
      type === "input_text" ||
      type === "output_text" ||
      type === "refusal" ||
      type === "thinking"
    ) {
      const t = type === "refusal" ? p.refusal : type === "thinking" ? p.thinking : p.text;
      if (t === null || t === undefined) {
        if (type === "text" || type === "refusal") continue;
      }
      out.push(wrap ? { type: "text", text: t } : t);
      continue;
    }
    if (type === "tool_reference") {
      out.push(wrap ? { type: "tool_reference", name: p.name } : p.name);
      continue;
    }
    const mod = partModality(type);
    if (!mod) throw httpError(400, "unsupported chat content part type: " + type);
    if (wrap) out.push({ type: mod });
    else media.push(mod);
  }
  if (wrap) return out;
  const text = out.join("\n");
  if (!media.length) return text;
  // Placeholders the text does not already hold go in front, "\n"-separated.
  const ph = opts.placeholders || {};
  const missing: string[] = [];
  const seen: { [p: string]: number } = {};
  for (let i = 0; i < media.length; i++) {
    const s = ph[media[i]] || PLACEHOLDER_KEYS[media[i]];
    seen[s] = (seen[s] || 0) + 1;
  }
  for (const s in seen) {
    const have = text.split(s).length - 1;
    for (let k = have; k < seen[s]; k++) missing.push(s);
  }
  if (text) missing.push(text);
  return missing.join("\n");
}

/** vLLM parse_chat_messages + _postprocess_messages: the conversation the template sees. */
export function conversation(input: ChatInput, opts: RenderOptions): any[] {
  const out: any[] = [];
  for (let i = 0; i < input.messages.length; i++) {
    const msg = input.messages[i];
    const where = "messages[" + i + "]";
    if (!isObj(msg) || typeof msg.role !== "string") throw httpError(400, where + " needs a string 'role'");
    const role = msg.role;
    const r: { [k: string]: any } = { role: role, content: parseParts(role, msg.content, opts, where) };
    if (role === "assistant") {
      if (msg.tool_calls !== undefined && msg.tool_calls !== null) {
        if (!(msg.tool_calls instanceof Array)) throw httpError(400, where + ".tool_calls must be an array");
        r.tool_calls = cloneJson(msg.tool_calls);
      }
      // vLLM reads only `reasoning` (a `reasoning_content` on input is dropped; vllm#38488).
      if (msg.reasoning !== undefined && msg.reasoning !== null) {
        r.reasoning = msg.reasoning;
        r.reasoning_content = msg.reasoning;
      }
    } else if (role === "tool") {
      if (msg.tool_call_id !== undefined) r.tool_call_id = msg.tool_call_id;
      const c = r.content;
      if (c instanceof Array) {
        let nonText = false;
        for (let k = 0; k < c.length; k++) if (isObj(c[k]) && c[k].type !== "text") nonText = true;
        if (!nonText) {
          const texts: string[] = [];
          for (let k = 0; k < c.length; k++)
            if (isObj(c[k]) && c[k].type === "text") texts.push(c[k].text === undefined ? "" : c[k].text);
          r.content = texts.join("\n");
        }
      }
    }
    if (typeof msg.name === "string") r.name = msg.name;
    if (typeof msg.task === "string") r.task = msg.task;
    if (role === "developer") r.tools = msg.tools === undefined ? null : msg.tools;
    out.push(r);
  }
  for (let i = 0; i < out.length; i++) {
    const m = out[i];
    if (m.role !== "assistant" || !(m.tool_calls instanceof Array)) continue;
    if (m.tool_calls.length === 0) {
      delete m.tool_calls;
      continue;
    }
    for (let k = 0; k < m.tool_calls.length; k++) {
      const item = m.tool_calls[k];
      if (!isObj(item) || !isObj(item.function))
        throw httpError(400, "messages[" + i + "].tool_calls[" + k + "] needs a 'function'");
      const a = item.function.arguments;
      if (typeof a === "string") {
        let v: any;
        try {
          v = parseJson(a);
        } catch (e) {
          v = {};
        }
        item.function.arguments = v;
      } else if (!(typeof a === "object" && a !== null)) item.function.arguments = {};
    }
  }
  return out;
}

/** Request tools as vLLM's ChatCompletionToolsParam.model_dump() hands them to the template. */
export function normalizeTools(tools: any): any[] | null {
  if (tools === undefined || tools === null) return null;
  if (!(tools instanceof Array)) throw httpError(400, "'tools' must be an array");
  const out: any[] = [];
  for (let i = 0; i < tools.length; i++) {
    const t = tools[i];
    if (!isObj(t) || !isObj(t.function) || typeof t.function.name !== "string")
      throw httpError(400, "tools[" + i + "] needs function.name");
    const f = t.function;
    const fn: { [k: string]: any } = {
      name: f.name,
      description: f.description === undefined ? null : f.description,
      parameters: f.parameters === undefined ? null : cloneJson(f.parameters),
    };
    for (const k in f) if (k !== "name" && k !== "description" && k !== "parameters") fn[k] = cloneJson(f[k]);
    const tool: { [k: string]: any } = { type: t.type === undefined ? "function" : t.type, function: fn };
    for (const k in t) if (k !== "type" && k !== "function") tool[k] = cloneJson(t[k]);
    out.push(tool);
  }
  // vLLM hands the template no tools for an empty list.
  return out.length ? out : null;
}

function anthropicImageUrl(src: any): string {
  if (!isObj(src)) return "";
  if (src.type === "url") return typeof src.url === "string" ? src.url : "";
  return "data:" + (src.media_type || "image/jpeg") + ";base64," + (src.data || "");
}

const BILLING = "x-anthropic-billing-header";

/** Anthropic /v1/messages -> OpenAI messages + tools, as vLLM's Anthropic endpoint converts them. */
export function anthropicToOpenAI(j: { [k: string]: any }): { messages: any[]; tools: any[] | null } {
  if (!(j.messages instanceof Array) || j.messages.length === 0)
    throw httpError(400, "'messages' must be a non-empty array");
  const out: any[] = [];
  const sys: string[] = [];
  const addSys = (s: any) => {
    if (typeof s === "string") sys.push(s);
    else if (s instanceof Array)
      for (let i = 0; i < s.length; i++) {
        const b = s[i];
        if (isObj(b) && b.type === "text" && b.text && String(b.text).indexOf(BILLING) !== 0) sys.push(b.text);
      }
  };
  if (j.system) addSys(j.system);
  for (let i = 0; i < j.messages.length; i++) {
    const m = j.messages[i];
    if (!isObj(m) || typeof m.role !== "string") throw httpError(400, "messages[" + i + "] needs a string 'role'");
    if (m.role === "system") addSys(m.content);
  }
  if (sys.length) out.push({ role: "system", content: sys.join("") });
  for (let i = 0; i < j.messages.length; i++) {
    const m = j.messages[i];
    if (m.role === "system") continue;
    const om: { [k: string]: any } = { role: m.role };
    if (typeof m.content === "string") om.content = m.content;
    else if (m.content instanceof Array) {
      const parts: any[] = [];
      const calls: any[] = [];
      const reasoning: string[] = [];
      for (let k = 0; k < m.content.length; k++) {
        const b = m.content[k];
        if (!isObj(b)) throw httpError(400, "messages[" + i + "].content[" + k + "] must be an object");
        if (b.type === "text" && b.text) parts.push({ type: "text", text: b.text });
        else if (b.type === "image" && b.source)
          parts.push({ type: "image_url", image_url: { url: anthropicImageUrl(b.source) } });
        else if (b.type === "thinking" && b.thinking !== undefined && b.thinking !== null) reasoning.push(b.thinking);
        else if (b.type === "tool_use")
          calls.push({
            id: b.id || "call_0",
            type: "function",
            function: { name: b.name || "", arguments: stringifyJson(b.input || {}) },
          });
        else if (b.type === "tool_result") {
          if (m.role === "user") {
            let text = "";
            const images: string[] = [];
            if (typeof b.content === "string") text = b.content;
            else if (b.content instanceof Array) {
              const ts: string[] = [];
              for (let q = 0; q < b.content.length; q++) {
                const it = b.content[q];
                if (!isObj(it)) continue;
                if (it.type === "text") ts.push(it.text === undefined ? "" : it.text);
                else if (it.type === "image") {
                  const u = anthropicImageUrl(it.source || {});
                  if (u) images.push(u);
                }
              }
              text = ts.join("\n");
            }
            // Tool results go out as tool messages ahead of the turn's other content.
            out.push({ role: "tool", tool_call_id: b.tool_use_id || "", content: text || "" });
            if (images.length) {
              const ip: any[] = [];
              for (let q = 0; q < images.length; q++) ip.push({ type: "image_url", image_url: { url: images[q] } });
              out.push({ role: "user", content: ip });
            }
          } else if (typeof b.content === "string" && b.content)
            parts.push({ type: "text", text: "Tool result: " + b.content });
        }
      }
      if (reasoning.length) om.reasoning = reasoning.join("");
      if (calls.length) om.tool_calls = calls;
      if (parts.length) om.content = parts.length === 1 && parts[0].type === "text" ? parts[0].text : parts;
    } else throw httpError(400, "messages[" + i + "].content must be a string or an array of blocks");
    if (!(m.role === "user" && om.content === undefined)) out.push(om);
  }
  let tools: any[] | null = null;
  if (j.tools instanceof Array) {
    tools = [];
    for (let i = 0; i < j.tools.length; i++) {
      const t = j.tools[i];
      if (!isObj(t) || typeof t.name !== "string") throw httpError(400, "tools[" + i + "] needs a name");
      tools.push({
        type: "function",
        function: {
          name: t.name,
          description: t.description === undefined ? null : t.description,
          parameters: t.input_schema === undefined ? null : cloneJson(t.input_schema),
          defer_loading: t.defer_loading === undefined ? null : t.defer_loading,
        },
      });
    }
    if (!tools.length) tools = null;
  }
  return { messages: out, tools: tools };
}

/** The chat part of an OpenAI chat or Anthropic messages body. */
export function chatInputOf(endpoint: "chat" | "messages", j: { [k: string]: any }): ChatInput {
  let messages: any[];
  let tools: any[] | null;
  if (endpoint === "messages") {
    const a = anthropicToOpenAI(j);
    messages = a.messages;
    tools = a.tools;
  } else {
    if (!(j.messages instanceof Array) || j.messages.length === 0)
      throw httpError(400, "'messages' must be a non-empty array");
    messages = j.messages;
    tools = normalizeTools(j.tools);
  }
  const kw = j.chat_template_kwargs;
  if (kw !== undefined && kw !== null && !isObj(kw)) throw httpError(400, "'chat_template_kwargs' must be an object");
  const agp = j.add_generation_prompt === undefined ? true : j.add_generation_prompt === true;
  const cfm = j.continue_final_message === true;
  if (agp && cfm) throw httpError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
  let effort = j.reasoning_effort === undefined ? null : j.reasoning_effort;
  if (
    endpoint === "messages" &&
    isObj(j.output_config) &&
    j.output_config.effort !== undefined &&
    j.output_config.effort !== null
  )
    effort = j.output_config.effort;
  return {
    messages: messages,
    tools: tools,
    documents: j.documents === undefined ? null : j.documents,
    addGenerationPrompt: agp,
    continueFinalMessage: cfm,
    reasoningEffort: effort,
    kwargs: isObj(kw) ? kw : {},
  };
}

const REASONING_FIELDS = ["reasoning_content", "thinking", "reasoning"];
const CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG ";

export interface Prepared {
  ctx: { [k: string]: any };
  /** continue_final_message: the render is cut at the tag put after the final text. */
  cont: boolean;
  /** The final message's text before the tag (transformers checks it survived the render). */
  finalText: string;
}

/**
 * The template variables, merged the way the engine merges them: the
 * tokenizer's special tokens under the request-level values, the request's
 * chat_template_kwargs over those (vLLM), and transformers' reasoning aliases
 * (a message's reasoning also readable as reasoning_content and thinking).
 */
export function renderPrepare(
  input: ChatInput,
  opts: RenderOptions,
  special: { [k: string]: string },
  template: string,
): Prepared {
  const conv = conversation(input, opts);
  for (let i = 0; i < conv.length; i++) {
    const m = conv[i];
    let r: any = null;
    for (let k = 0; k < REASONING_FIELDS.length; k++)
      if (m[REASONING_FIELDS[k]] !== undefined && m[REASONING_FIELDS[k]] !== null) {
        r = m[REASONING_FIELDS[k]];
        break;
      }
    if (r === null) continue;
    const a: { [k: string]: any } = { thinking: r };
    for (const k in m) a[k] = m[k];
    a.reasoning_content = r;
    conv[i] = a;
  }
  const ctx: { [k: string]: any } = {};
  for (const k in special) ctx[k] = special[k];
  const req: { [k: string]: any } = {
    add_generation_prompt: input.addGenerationPrompt,
    tools: input.tools,
    documents: input.documents,
    reasoning_effort: input.reasoningEffort,
  };
  for (const k in input.kwargs)
    if (k !== "chat_template" && k !== "tokenize" && k !== "continue_final_message") req[k] = input.kwargs[k];
  for (const k in req) ctx[k] = req[k];
  const cont = input.continueFinalMessage;
  let finalText = "";
  if (cont) {
    if (!conv.length) throw httpError(400, "continue_final_message is set but the conversation is empty");
    if (template.indexOf("content") < 0)
      throw httpError(400, "continue_final_message needs a template that reads message content");
    const last = conv[conv.length - 1];
    const fm = last.content;
    if (fm === null || fm === undefined)
      throw httpError(400, "continue_final_message is set but the final message has no content");
    if (fm instanceof Array) {
      let done = false;
      for (let i = fm.length - 1; i >= 0 && !done; i--)
        if (isObj(fm[i]) && fm[i].text !== undefined) {
          finalText = String(fm[i].text);
          fm[i].text = fm[i].text + CONTINUE_TAG;
          done = true;
        }
      if (!done) throw httpError(400, "continue_final_message is set but the final message has no text");
    } else {
      finalText = String(fm);
      last.content = fm + CONTINUE_TAG;
    }
  }
  ctx.messages = conv;
  return { ctx: ctx, cont: cont, finalText: finalText };
}

/** transformers' continue_final_message cut: the prompt ends where the final message's text ends. */
export function renderFinish(rendered: string, p: Prepared): string {
  if (!p.cont) return rendered;
  const tag = "CONTINUE_FINAL_MESSAGE_TAG";
  const at = rendered.lastIndexOf(tag);
  if (at < 0 || rendered.indexOf(pyStrip(p.finalText)) < 0)
    throw httpError(400, "continue_final_message is set but the final message does not appear in the rendered chat");
  if (rendered.substr(at, CONTINUE_TAG.length) === CONTINUE_TAG) return rendered.substring(0, at);
  return pyRstrip(rendered.substring(0, at));
}

// Python str.rstrip() whitespace.
const PY_WS =
  " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000";
function pyStrip(s: string): string {
  let b = 0;
  while (b < s.length && PY_WS.indexOf(s.charAt(b)) >= 0) b++;
  return pyRstrip(s.substring(b));
}
function pyRstrip(s: string): string {
  let e = s.length;
  while (e > 0 && PY_WS.indexOf(s.charAt(e - 1)) >= 0) e--;
  return s.substring(0, e);
}

/** A chat of plain messages with the engine's defaults (generation prompt on). */
export function plainChat(messages: any[]): ChatInput {
  return {
    messages: messages,
    tools: null,
    documents: null,
    addGenerationPrompt: true,
    continueFinalMessage: false,
    reasoningEffort: null,
    kwargs: {},
  };
}

/** Chat renderer for a parsed template (runtime/jinja.ts templateAst), Envoy and nginx alike. */
export function chatRenderer(
  ast: any,
  special: { [k: string]: string },
  format: ContentFormat,
  templateSrcHasContent: boolean,
): (chat: ChatInput) => string {
  return function (chat: ChatInput): string {
    const p = renderPrepare(chat, { format: format }, special, templateSrcHasContent ? "content" : "");
    return renderFinish(renderTemplate(ast, p.ctx), p);
  };
}
