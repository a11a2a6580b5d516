// Lint for the whole project: typescript-eslint's recommended rules, and for
// core/ the njs syntax subset (core/ is also compiled into the njs bundle,
// whose engines lack these; njs/build.ts checks the lowered bundle as well).
import js from "@eslint/js";
import tseslint from "typescript-eslint";

const NJS_SUBSET = [
  {
    selector: "ClassDeclaration, ClassExpression",
    message: "njs subset (core/): no class; use plain objects and functions",
  },
  { selector: "ForOfStatement", message: "njs subset (core/): no for-of; use an index loop" },
  { selector: "SpreadElement, RestElement", message: "njs subset (core/): no spread or rest" },
  { selector: "ObjectPattern, ArrayPattern", message: "njs subset (core/): no destructuring" },
  { selector: "AssignmentPattern", message: "njs subset (core/): no default parameters" },
  { selector: ":function[generator=true]", message: "njs subset (core/): no generators" },
  { selector: "ChainExpression", message: "njs subset (core/): no optional chaining" },
  { selector: "Literal[bigint]", message: "njs subset (core/): no BigInt" },
  { selector: "Literal[regex.flags=/u/]", message: "njs subset (core/): no regex u flag" },
  {
    selector: "NewExpression[callee.name=/^(Map|Set|WeakMap|WeakSet)$/]",
    message: "njs subset (core/): no Map or Set; use an object keyed by string",
  },
  { selector: "CallExpression[callee.name='BigInt']", message: "njs subset (core/): no BigInt" },
];

export default tseslint.config(
  {
    ignores: [
      "node_modules/**",
      "dist/**",
      "njs/dist/**",
      "njs/build/**",
      "extproc/gen/**",
      ".njs-0.8/**",
      "bench/results/**",
      "**/*.js",
      "**/*.mjs",
    ],
  },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      // The wire and JSON code handles untyped data on purpose.
      "@typescript-eslint/no-explicit-any": "off",
      "@typescript-eslint/no-unused-vars": [
        "error",
        { args: "after-used", argsIgnorePattern: "^_", varsIgnorePattern: "^_", caughtErrors: "none" },
      ],
      // Parsers of wire and text formats match control characters on purpose.
      "no-control-regex": "off",
      // Closures over `self` in the stream and replica code are deliberate.
      "@typescript-eslint/no-this-alias": "off",
      // try/catch assignments of a default before the try read as useless to this rule.
      "no-useless-assignment": "off",
      // Errors rethrown with their own one-line message, the cause logged where it matters.
      "preserve-caught-error": "off",
    },
  },
  {
    files: ["core/**/*.ts"],
    // The Node-only state backends (njs runs keyed.ts over its shared dicts) may use Node's collections.
    ignores: ["core/state/memory.ts", "core/state/typed-mirror.ts", "core/state/generations.ts"],
    rules: { "no-restricted-syntax": ["error", ...NJS_SUBSET] },
  },
);
