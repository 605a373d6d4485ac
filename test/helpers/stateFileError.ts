import { parseStateFile, StateFileError } from '../../src/cli/stateFile.js';

/** The StateFileError that parsing `text` as the file `name` throws; fails when the file is accepted. */
export function stateFileError(text: string, name = 'state.yaml'): StateFileError {
  try {
    parseStateFile(name, text);
  } catch (e) {
    if (e instanceof StateFileError) return e;
    throw e;
  }
  throw new Error('the file was accepted');
}
