// The benches' command-line reading: `--name value` pairs over argv.

/** opt(name, def): the word after name in argv, or def when name is absent or last. */
export function optionReader(argv: string[]): (name: string, def: string) => string {
  return (name, def) => {
    const i = argv.indexOf(name);
    return i >= 0 && i + 1 < argv.length ? argv[i + 1] : def;
  };
}
