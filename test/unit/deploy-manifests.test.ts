/**
 * The manifests under image/deploy against the code and the image: every file parses; probe
 * paths are routes of natgw's express app; every env key is one natgw knows, with values its
 * schema accepts; the env file, state dir, socket and token are where natgw looks for them and
 * mounted as they must be; the container's command and the shim path are the ones
 * image/Dockerfile creates; every object is valid against the Kubernetes schemas
 * (kubernetes-models), unknown fields included; the workloads carry what Kube-OVN's controller
 * gives its gateways; the derived image's env file (the configuration path under an unmodified
 * controller) loads.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, posix } from 'node:path';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { validate as validateConfigMap } from 'kubernetes-models/_schemas/IoK8sApiCoreV1ConfigMap';
import { validate as validateSecret } from 'kubernetes-models/_schemas/IoK8sApiCoreV1Secret';
import { validate as validateService } from 'kubernetes-models/_schemas/IoK8sApiCoreV1Service';
import { validate as validateDeployment } from 'kubernetes-models/_schemas/IoK8sApiAppsV1Deployment';
import { validate as validateStatefulSet } from 'kubernetes-models/_schemas/IoK8sApiAppsV1StatefulSet';
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

// ---------------------------------------------------------------------------------
// The Kubernetes schemas (kubernetes-models: the API's OpenAPI schemas as validators)
// ---------------------------------------------------------------------------------

type SchemaValidator = ((data: unknown) => boolean) & {
  errors?: Array<{ instancePath: string; keyword: string; params: Record<string, unknown> }> | null;
};
const SCHEMAS: Record<string, SchemaValidator> = {
  'v1/ConfigMap': validateConfigMap,
  'v1/Secret': validateSecret,
  'v1/Service': validateService,
  'apps/v1/Deployment': validateDeployment,
  'apps/v1/StatefulSet': validateStatefulSet,
};

/** `value` seen through proxies that record the path of every own field a reader looks at. */
function recordReads(value: unknown, path: string, read: Set<string>): unknown {
  if (value === null || typeof value !== 'object') return value;
  return new Proxy(value, {
    get(target, key, receiver) {
      const v = Reflect.get(target, key, receiver) as unknown;
      if (typeof key !== 'string' || !Object.hasOwn(target, key)) return v;
      read.add(`${path}/${key}`);
      return recordReads(v, `${path}/${key}`, read);
    },
  });
}

function fieldPaths(value: unknown, path: string, out: string[] = []): string[] {
  if (value !== null && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) {
      out.push(`${path}/${k}`);
      fieldPaths(v, `${path}/${k}`, out);
    }
  }
  return out;
}

/**
 * Every way `body` breaks its kind's schema: types, formats, enums and required fields from the
 * validator, and, as the API server's strict field validation (`kubectl apply
 * --validate=strict`) reports, fields the schema does not define. Those are the fields the
 * validator never looked at: it reads every field its schema names, and every entry of a map.
 */
function schemaErrors(body: Record<string, any>): string[] {
  const validate = SCHEMAS[`${body.apiVersion}/${body.kind}`];
  if (validate === undefined) return [`no schema here for apiVersion ${body.apiVersion} kind ${body.kind}`];
  const read = new Set<string>();
  const errors = validate(recordReads(body, '', read))
    ? []
    : (validate.errors ?? []).map((e) => `${e.instancePath || '/'}: ${e.keyword} ${JSON.stringify(e.params)}`);
  const unknown = fieldPaths(body, '').filter((p) => !read.has(p));
  // Only the outermost unknown field: what lies under it is unknown with it.
  errors.push(...unknown.filter((p) => !unknown.includes(p.slice(0, p.lastIndexOf('/')))).map((p) => `${p}: unknown field`));
  return errors;
}

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
      // natgw's own containers (a sidecar such as bfdd has its own image's settings).
      for (const c of [...(spec.initContainers ?? []), spec.containers[0]]) {
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
    // natgw's containers: the init container and the main one (a sidecar such as the
    // replicated mode's bfdd runs Kube-OVN's own image).
    const images = new Set(podSpecs.flatMap(({ spec }) => [...(spec.initContainers ?? []), spec.containers[0]].map((c: { image: string }) => c.image)));
    const controller = objects.find((o) => o.kind === 'ConfigMap' && o.name === 'ovn-vpc-nat-config');
    expect(controller?.body.metadata.namespace).toBe('kube-system');
    expect([...images, controller?.body.data.image]).toEqual([built, built]);
  });
});

/** The controller's names for a gateway's workload and pods (kube-ovn pkg/util/vpc_nat_gateway.go). */
const VPC_NAT_GW_LABEL = 'ovn.kubernetes.io/vpc-nat-gw';
const ANNOTATION = {
  networks: 'k8s.v1.cni.cncf.io/networks',
  gateway: 'ovn.kubernetes.io/vpc_nat_gw',
  logicalSwitch: 'ovn.kubernetes.io/logical_switch',
  ipAddress: 'ovn.kubernetes.io/ip_address',
  routes: 'ovn.kubernetes.io/routes',
} as const;

describe('image/deploy against the Kubernetes schemas', () => {
  it('every object is valid for its kind, with no field its schema lacks', () => {
    expect(objects.map((o) => `${o.body.apiVersion}/${o.kind}`).sort()).toEqual(
      expect.arrayContaining(['apps/v1/Deployment', 'apps/v1/StatefulSet', 'v1/ConfigMap', 'v1/Secret', 'v1/Service']),
    );
    for (const o of objects) expect(schemaErrors(o.body), `${o.file}: ${o.kind} ${o.name}`).toEqual([]);
  });

  it('a misspelled field, a wrong type or a missing required field fails the check', () => {
    const sts = objects.find((o) => o.kind === 'StatefulSet');
    expect(sts).toBeDefined();
    const broken = structuredClone(sts?.body ?? {});
    const main = broken.spec.template.spec.containers[0];
    main.imagee = main.image;
    delete main.image;
    broken.spec.replicas = '1';
    broken.spec.template.spec.volumes[0].emptyDirr = {};
    delete broken.spec.selector;
    expect(schemaErrors(broken).sort()).toEqual(
      [
        '/spec/replicas: type {"type":"integer"}',
        '/spec: required {"missingProperty":"selector"}',
        '/spec/template/spec/containers/0/imagee: unknown field',
        '/spec/template/spec/volumes/0/emptyDirr: unknown field',
      ].sort(),
    );
    expect(schemaErrors({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'x' }, data: { n: 1 } })).toEqual(['/data/n: type {"type":"string"}']);
    expect(schemaErrors({ ...sts?.body, apiVersion: 'apps/v1beta9' })).toEqual(['no schema here for apiVersion apps/v1beta9 kind StatefulSet']);
  });
});

describe("image/deploy workloads as Kube-OVN's controller lays out a gateway", () => {
  const workloads = objects.filter((o) => o.kind === 'StatefulSet' || o.kind === 'Deployment');

  it('show both modes: a single-replica StatefulSet and a replicated Deployment with the BFD sidecar', () => {
    const sts = workloads.filter((o) => o.kind === 'StatefulSet');
    const deploy = workloads.filter((o) => o.kind === 'Deployment');
    expect(sts.map((o) => o.body.spec.replicas)).toEqual([1]);
    expect(deploy).toHaveLength(1);
    expect(deploy[0]?.body.spec.replicas).toBeGreaterThan(1);
    expect(deploy[0]?.body.spec.strategy).toEqual({ type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 1, maxSurge: 0 } });
    const spec = deploy[0]?.body.spec.template.spec;
    const bfdd = (spec.containers as Array<Record<string, any>>).find((c) => c.name === 'bfdd');
    const bfddEnv = (bfdd?.env ?? []) as Array<{ name: string; value?: string }>;
    expect(bfdd?.command).toEqual(['bash', '/kube-ovn/start-bfdd.sh']);
    expect(bfddEnv.map((e) => e.name)).toEqual(['POD_IPS', 'BFD_PEER_IPS', 'BFD_MIN_TX', 'BFD_MIN_RX', 'BFD_MULTI']);
    const anti = spec.affinity?.podAntiAffinity?.requiredDuringSchedulingIgnoredDuringExecution?.[0];
    expect(anti?.topologyKey).toBe('kubernetes.io/hostname');
    expect(anti?.labelSelector?.matchLabels).toEqual(deploy[0]?.body.spec.selector.matchLabels);
    // The BFD peer is routed via eth0's gateway, as generateNatGwRoutes adds it.
    const peer = bfddEnv.find((e) => e.name === 'BFD_PEER_IPS')?.value;
    const routes = JSON.parse(deploy[0]?.body.spec.template.metadata.annotations[ANNOTATION.routes]) as Array<{ dst: string }>;
    expect(routes.map((r) => r.dst)).toContain(`${peer}/32`);
  });

  it("carry the controller's names, labels and VPC attachment annotations", () => {
    for (const o of workloads) {
      const gw = o.body.spec.template.metadata.annotations[ANNOTATION.gateway] as string;
      const labels = { app: `vpc-nat-gw-${gw}`, [VPC_NAT_GW_LABEL]: 'true' };
      expect(o.name, o.file).toBe(`vpc-nat-gw-${gw}`);
      expect(o.body.metadata.labels, o.file).toEqual(labels);
      expect(o.body.spec.selector.matchLabels, o.file).toEqual(labels);
      expect(o.body.spec.template.metadata.labels, o.file).toEqual(labels);
      const a = o.body.spec.template.metadata.annotations as Record<string, string>;
      expect(a[ANNOTATION.networks], o.file).toMatch(/^[a-z0-9-]+\/[a-z0-9-]+$/);
      expect(a[ANNOTATION.logicalSwitch], o.file).toMatch(/^[a-z0-9-]+$/);
      // A fixed LAN IP only for a single replica (GenNatGwPodAnnotations leaves it out in HA mode).
      expect(a[ANNOTATION.ipAddress] !== undefined, `${o.file}: ${ANNOTATION.ipAddress}`).toBe(o.body.spec.replicas === 1);
      // The default route goes out net1, via the external network's provider (<nad>.<namespace>).
      const [ns, nad] = (a[ANNOTATION.networks] ?? '').split('/');
      const ext = JSON.parse(a[`${nad}.${ns}.kubernetes.io/routes`] ?? '[]') as Array<{ dst: string; gw: string }>;
      expect(
        ext.map((r) => r.dst),
        o.file,
      ).toEqual(['0.0.0.0/0']);
      expect(ext[0]?.gw, `${o.file}: net1's gateway is GATEWAY_V4`).toBe(config.gatewayV4);
    }
  });

  it("define the Service a StatefulSet's serviceName names, selecting its pods", () => {
    for (const o of workloads.filter((w) => w.kind === 'StatefulSet')) {
      const svc = objects.find((x) => x.kind === 'Service' && x.name === o.body.spec.serviceName && x.body.metadata.namespace === o.body.metadata.namespace);
      expect(svc, `${o.file}: Service ${o.body.spec.serviceName}`).toBeDefined();
      expect(svc?.body.spec.clusterIP).toBe('None');
      const podLabels = o.body.spec.template.metadata.labels as Record<string, string>;
      for (const [k, v] of Object.entries(svc?.body.spec.selector ?? {})) expect(podLabels[k], `selector ${k}`).toBe(v);
      expect(Object.keys(svc?.body.spec.selector ?? {}).length).toBeGreaterThan(0);
    }
  });
});

describe('the TCP API in image/deploy', () => {
  it('is off by default; turned on, it binds to a port alone (the VPC side) and reads the token from the Secret', async () => {
    expect(config.listen).toBeUndefined();
    const { text } = envFileConfigMap();
    const on = text.replace(/^#(NATGW_LISTEN|NATGW_TOKEN_FILE)=/gm, '$1=');
    expect(on).not.toBe(text);
    const file = join(tmp, 'api-on.env');
    writeFileSync(file, on);
    const withApi = await loadConfig({ NATGW_ENV_FILE: file });
    expect(withApi.listen, 'a port alone: natgw binds it to the VPC interface').toMatch(/^:?\d+$/);
    expect(withApi.tokenFile).toBeDefined();
    for (const { o, spec } of podSpecs) {
      const main = spec.containers[0] as Record<string, any>;
      const mount = ((main.volumeMounts ?? []) as Array<Record<string, any>>).find((m) => m.mountPath === dirname(withApi.tokenFile ?? ''));
      const volume = (spec.volumes as Array<Record<string, any>>).find((v) => v.name === mount?.name);
      const secret = objects.find((x) => x.kind === 'Secret' && x.name === volume?.secret?.secretName);
      expect(secret, `${o.file}: the token's Secret`).toBeDefined();
      const token = { ...secret?.body.stringData }[posix.basename(withApi.tokenFile ?? '')] as string | undefined;
      // A placeholder natgw refuses (shorter than 32 bytes and saying so), never a usable token.
      expect(token, `${o.file}: the Secret's token`).toMatch(/^REPLACE-/);
      expect(Buffer.byteLength(token ?? '')).toBeLessThan(32);
      expect((main.ports as Array<{ containerPort: number }>).map((p) => String(p.containerPort))).toContain(withApi.listen?.replace(/^:/, ''));
    }
  });
});

describe('configuration under an unmodified controller: the derived image (image/deploy/derived)', () => {
  const DERIVED = join(DEPLOY, 'derived');

  it("bakes the env file in at natgw's default place, on top of natgw's image", () => {
    const text = readFileSync(join(DERIVED, 'Containerfile'), 'utf8');
    const lines = text.split('\n').filter((l) => l.trim() !== '' && !l.startsWith('#'));
    const from = lines.find((l) => l.startsWith('FROM '));
    const arg = /^ARG NATGW_IMAGE=(\S+)$/m.exec(text)?.[1];
    expect(from).toBe('FROM ${NATGW_IMAGE}');
    const build = readFileSync(join(REPO_ROOT, 'image', 'build.sh'), 'utf8');
    expect(arg).toBe(/image=\$\{NATGW_IMAGE:-([^}]+)\}/.exec(build)?.[1]);
    expect(lines.filter((l) => l.startsWith('COPY '))).toEqual([`COPY nat-gateway.env ${DEFAULT_ENV_FILE}`]);
  });

  it("loads with the controller's environment, which keeps its per-gateway GATEWAY_V4/GATEWAY_V6", async () => {
    const text = readFileSync(join(DERIVED, 'nat-gateway.env'), 'utf8');
    const keys = Object.keys(parseEnvFile(text));
    expect(keys.length).toBeGreaterThan(0);
    expect(keys.filter((k) => !CONFIG_KEYS.includes(k))).toEqual([]);
    // The file wins over the environment: it must leave the controller's keys alone.
    expect(keys.filter((k) => k === 'GATEWAY_V4' || k === 'GATEWAY_V6')).toEqual([]);
    const loaded = await loadConfig({ NATGW_ENV_FILE: join(DERIVED, 'nat-gateway.env'), GATEWAY_V4: '192.0.2.1', GATEWAY_V6: '' });
    expect(loaded.gatewayV4).toBe('192.0.2.1');
    expect(loaded.listen).toBeUndefined();
    // The file's own settings reach natgw (1m: not the default 30s).
    expect(loaded.resyncMs).toBe(60_000);
  });
});
