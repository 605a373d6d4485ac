/**
 * The manifests under image/deploy against the code and the image: every file parses; probe
 * paths are routes of natgw's express app; every env key is one natgw knows, with values its
 * schema accepts; the env file, state dir, socket and token are where natgw looks for them and
 * mounted as they must be; the container's command and the shim path are the ones
 * image/Dockerfile creates.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, posix } from 'node:path';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { OPEN_PATHS } from '../../src/api/auth.js';
import { createApp } from '../../src/api/app.js';
import { CONFIG_KEYS, DEFAULT_ENV_FILE, loadConfig, type Config } from '../../src/config/config.js';
import { parseEnvFile } from '../../src/config/envFile.js';
import { REPO_ROOT } from '../helpers/netns.js';
import { FakeEngine, fakeAgent } from '../api/fakeEngine.js';

/** Where the Kube-OVN controller execs the script (`bash /kube-ovn/nat-gateway.sh …`). */
const KUBE_OVN_SHIM = '/kube-ovn/nat-gateway.sh';
const DEPLOY = join(REPO_ROOT, 'image', 'deploy');
/** Keys natgw reads from the environment: the schema's, and the env file's own location. */
const ENV_KEYS = new Set([...CONFIG_KEYS, 'NATGW_ENV_FILE']);

// ---------------------------------------------------------------------------------
// image/Dockerfile, as far as the manifests depend on it
// ---------------------------------------------------------------------------------

interface Dockerfile {
  readonly entrypoint: string[];
  readonly cmd: string[];
  /** COPY destinations of the final stage by source (`--from=stage` sources as `stage:path`). */
  readonly copies: Map<string, string>;
}

function parseDockerfile(text: string): Dockerfile {
  const instructions = text
    .replace(/\\\n/g, ' ')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'));
  const lastFrom = instructions.map((l) => /^FROM\s/i.test(l)).lastIndexOf(true);
  const final = instructions.slice(lastFrom);
  const json = (kw: string): string[] => {
    const line = final.filter((l) => l.toUpperCase().startsWith(`${kw} `)).at(-1);
    if (line === undefined) throw new Error(`no ${kw} in the final stage`);
    return JSON.parse(line.slice(kw.length + 1)) as string[];
  };
  const copies = new Map<string, string>();
  for (const l of final.filter((x) => /^COPY\s/i.test(x))) {
    const words = l.split(/\s+/).slice(1);
    const from = words.find((w) => w.startsWith('--from='))?.slice('--from='.length);
    const [src, dest] = words.filter((w) => !w.startsWith('--'));
    if (src !== undefined && dest !== undefined) copies.set(from ? `${from}:${src}` : src, dest);
  }
  return { entrypoint: json('ENTRYPOINT'), cmd: json('CMD'), copies };
}

const dockerfile = parseDockerfile(readFileSync(join(REPO_ROOT, 'image', 'Dockerfile'), 'utf8'));
const shimPath = dockerfile.copies.get('image/nat-gateway.sh');

// ---------------------------------------------------------------------------------
// The manifests
// ---------------------------------------------------------------------------------

interface Obj {
  readonly file: string;
  readonly kind: string;
  readonly name: string;
  readonly body: Record<string, any>;
}

const manifestFiles = readdirSync(DEPLOY).filter((f) => /\.ya?ml$/.test(f));
const objects: Obj[] = manifestFiles.flatMap((file) =>
  parseAllDocuments(readFileSync(join(DEPLOY, file), 'utf8')).map((doc) => {
    if (doc.errors.length > 0) throw new Error(`${file}: ${doc.errors.map((e) => e.message).join('; ')}`);
    const body = doc.toJS() as Record<string, any>;
    return { file, kind: String(body.kind), name: String(body.metadata?.name), body };
  }),
);

const podSpecs = objects
  .map((o) => ({ o, spec: (o.kind === 'Pod' ? o.body.spec : o.body.spec?.template?.spec) as Record<string, any> | undefined }))
  .filter((p): p is { o: Obj; spec: Record<string, any> } => p.spec !== undefined && ['Pod', 'StatefulSet', 'Deployment', 'DaemonSet'].includes(p.o.kind));

/** The env file a pod's natgw reads: the ConfigMap entry named like the default file. */
function envFileConfigMap(): { obj: Obj; text: string } {
  const key = posix.basename(DEFAULT_ENV_FILE);
  const found = objects.filter((o) => o.kind === 'ConfigMap' && typeof o.body.data?.[key] === 'string');
  expect(found, `one ConfigMap holding ${key}`).toHaveLength(1);
  return { obj: found[0]!, text: found[0]!.body.data[key] as string };
}

let tmp: string;
let config: Config;

beforeAll(async () => {
  tmp = mkdtempSync(join(tmpdir(), 'natgw-deploy-'));
  const file = join(tmp, 'nat-gateway.env');
  writeFileSync(file, envFileConfigMap().text);
  // Only the file: nothing from the test's own environment may make the manifest look valid.
  config = await loadConfig({ NATGW_ENV_FILE: file });
});
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

describe('image/Dockerfile', () => {
  it('puts the shim where the Kube-OVN controller execs it, and natgw where the shim looks', () => {
    expect(shimPath).toBe(KUBE_OVN_SHIM);
    const shim = readFileSync(join(REPO_ROOT, 'image', 'nat-gateway.sh'), 'utf8');
    // The shim's lookup inside the image: "$here/natgw/bin/natgw.js", $here being its folder.
    expect(shim).toContain('"$here/natgw/bin/natgw.js"');
    expect(dockerfile.copies.get('build:/out/natgw')).toBe(posix.join(posix.dirname(KUBE_OVN_SHIM), 'natgw'));
  });

  it('runs the shim as its entrypoint and serve as its default command', () => {
    expect(dockerfile.entrypoint.slice(-2)).toEqual(['bash', KUBE_OVN_SHIM]);
    expect(dockerfile.cmd).toEqual(['serve']);
  });
});

describe('image/deploy manifests', () => {
  it('parse, and hold a gateway pod and its env file', () => {
    expect(manifestFiles.length).toBeGreaterThan(0);
    expect(podSpecs.length).toBeGreaterThan(0);
    envFileConfigMap();
  });

  it('set only env keys natgw knows, with values its schema accepts', () => {
    const keys = Object.keys(parseEnvFile(envFileConfigMap().text));
    expect(keys.filter((k) => !CONFIG_KEYS.includes(k))).toEqual([]);
    expect(keys.length).toBeGreaterThan(0);
    // loadConfig in beforeAll has validated the values; these are the ones the pod relies on.
    expect(config.listen === undefined || config.tokenFile !== undefined || config.tlsClientCa !== undefined).toBe(true);
    for (const { o, spec } of podSpecs) {
      for (const c of [...(spec.initContainers ?? []), ...(spec.containers ?? [])]) {
        const names = ((c.env ?? []) as Array<{ name: string }>).map((e) => e.name);
        expect(
          names.filter((n) => !ENV_KEYS.has(n)),
          `${o.file}: env of ${c.name}`,
        ).toEqual([]);
      }
    }
  });

  it("run the image's entrypoint with serve, so natgw is the pod's main process", () => {
    for (const { o, spec } of podSpecs) {
      const main = spec.containers[0] as Record<string, any>;
      const argv = [...((main.command as string[] | undefined) ?? dockerfile.entrypoint), ...((main.args as string[] | undefined) ?? dockerfile.cmd)];
      expect(argv, o.file).toEqual([...dockerfile.entrypoint, 'serve']);
      expect(main.securityContext?.privileged, `${o.file}: netfilter and links need a privileged container`).toBe(true);
    }
  });

  it('probe routes of the app (liveness /healthz, readiness /readyz) over the socket natgw listens on', async () => {
    const engine = await FakeEngine.create();
    const app = createApp({ agent: fakeAgent(engine), log: engine.log, bodyLimit: '64kb' });
    for (const { o, spec } of podSpecs) {
      const main = spec.containers[0] as Record<string, any>;
      const paths: Record<string, string> = {};
      for (const probe of ['livenessProbe', 'readinessProbe'] as const) {
        const p = main[probe] as Record<string, any> | undefined;
        expect(p, `${o.file}: ${probe}`).toBeDefined();
        let path: string | undefined = p?.httpGet?.path;
        const cmd = p?.exec?.command as string[] | undefined;
        if (cmd !== undefined) {
          expect(cmd[0], `${o.file}: ${probe} runs curl, which the image installs`).toBe('curl');
          expect(cmd, `${o.file}: ${probe} fails on an error status`).toContain('-fsS');
          const sock = cmd[cmd.indexOf('--unix-socket') + 1];
          expect(sock, `${o.file}: ${probe} socket`).toBe(config.socket);
          path = cmd.map((a) => /^http:\/\/localhost(\/\S*)$/.exec(a)?.[1]).find((x) => x !== undefined);
        }
        expect(path, `${o.file}: ${probe} path`).toBeDefined();
        paths[probe] = path ?? '';
        const res = await request(app).get(path ?? '');
        expect(res.status, `${o.file}: GET ${path} is a route`).not.toBe(404);
        // Open over TCP too, should a probe ever use the API port.
        expect(OPEN_PATHS.has(path ?? '')).toBe(true);
      }
      expect(paths).toEqual({ livenessProbe: '/healthz', readinessProbe: '/readyz' });
    }
  });

  it('mount a writable env file, the state dir on an emptyDir and the token from a Secret', () => {
    const { obj: cm } = envFileConfigMap();
    for (const { o, spec } of podSpecs) {
      const volumes = new Map((spec.volumes as Array<Record<string, any>>).map((v) => [v.name as string, v]));
      const main = spec.containers[0] as Record<string, any>;
      const mountAt = (c: Record<string, any>, path: string) => ((c.volumeMounts ?? []) as Array<Record<string, any>>).find((m) => m.mountPath === path);

      // init writes interface names back into the env file: not a read-only ConfigMap mount.
      const envMount = mountAt(main, dirname(DEFAULT_ENV_FILE));
      expect(envMount, `${o.file}: ${dirname(DEFAULT_ENV_FILE)} mounted`).toBeDefined();
      expect(volumes.get(envMount?.name)?.emptyDir, `${o.file}: env file dir is an emptyDir`).toBeDefined();
      const copier = ((spec.initContainers ?? []) as Array<Record<string, any>>).find((c) => (c.command as string[] | undefined)?.at(-1) === DEFAULT_ENV_FILE);
      expect(copier, `${o.file}: an init container copies the ConfigMap to ${DEFAULT_ENV_FILE}`).toBeDefined();
      const source = ((copier?.command ?? []) as string[]).at(-2) ?? '';
      const sourceMount = mountAt(copier ?? {}, dirname(source));
      expect(volumes.get(sourceMount?.name)?.configMap?.name, `${o.file}: ${source} comes from ${cm.name}`).toBe(cm.name);
      expect(posix.basename(source)).toBe(posix.basename(DEFAULT_ENV_FILE));

      const stateMount = mountAt(main, config.stateDir);
      expect(volumes.get(stateMount?.name)?.emptyDir, `${o.file}: ${config.stateDir} on an emptyDir`).toBeDefined();
      expect(mountAt(main, dirname(config.socket)), `${o.file}: the socket's directory is mounted`).toBeDefined();

      if (config.tokenFile !== undefined) {
        const tokenMount = mountAt(main, dirname(config.tokenFile));
        const secretName = volumes.get(tokenMount?.name)?.secret?.secretName as string | undefined;
        expect(secretName, `${o.file}: ${config.tokenFile} from a Secret`).toBeDefined();
        const secret = objects.find((x) => x.kind === 'Secret' && x.name === secretName);
        const keys = Object.keys({ ...secret?.body.data, ...secret?.body.stringData });
        expect(keys, `${o.file}: Secret ${secretName} holds ${posix.basename(config.tokenFile)}`).toContain(posix.basename(config.tokenFile));
        const port = Number(config.listen?.split(':').at(-1));
        expect((main.ports as Array<{ containerPort: number }>).map((p) => p.containerPort)).toContain(port);
      }
    }
  });

  it("name one image: the gateway pod's, the controller's image field and image/build.sh's default", () => {
    const build = readFileSync(join(REPO_ROOT, 'image', 'build.sh'), 'utf8');
    const built = /image=\$\{NATGW_IMAGE:-([^}]+)\}/.exec(build)?.[1];
    expect(built).toBeDefined();
    const images = new Set(podSpecs.flatMap(({ spec }) => [...(spec.initContainers ?? []), ...spec.containers].map((c: { image: string }) => c.image)));
    const controller = objects.find((o) => o.kind === 'ConfigMap' && o.name === 'ovn-vpc-nat-config');
    expect(controller?.body.metadata.namespace).toBe('kube-system');
    expect([...images, controller?.body.data.image]).toEqual([built, built]);
  });
});
