import { describe, expect, it } from 'vitest';
import { parseNetworkStatus } from '../../src/config/networkStatus.js';

const annotation = (entries: unknown) => `k8s.v1.cni.cncf.io/network-status=${JSON.stringify(JSON.stringify(entries, null, 4))}\nother="x"\n`;

describe('parseNetworkStatus (Multus downward-API file)', () => {
  it('takes the default network as VPC and the first attachment as external', () => {
    const text = annotation([
      { name: 'kube-ovn', interface: 'eth0', ips: ['10.0.1.254'], default: true },
      { name: 'kube-system/ovn-vpc-external-network', interface: 'net1', ips: ['172.20.0.10'] },
      { name: 'kube-system/other', interface: 'net2' },
    ]);
    expect(parseNetworkStatus(text)).toEqual({ vpc: 'eth0', ext: 'net1' });
  });

  it('ignores entries without a usable interface name, and bad files', () => {
    expect(parseNetworkStatus(annotation([{ name: 'a', interface: 'bad name', default: true }, { name: 'b' }]))).toEqual({});
    expect(parseNetworkStatus('k8s.v1.cni.cncf.io/network-status="not json"')).toEqual({});
    expect(parseNetworkStatus('')).toEqual({});
  });
});
