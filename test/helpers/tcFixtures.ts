/** `tc -d filter show` of three natgw u32 filters (EIP, gateway CIDR, catch-all), as iproute2 6.1 prints it. */
export const FILTERS = `filter protocol ip pref 1 u32 chain 0 
filter protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 
filter protocol ip pref 1 u32 chain 0 fh 800::1 order 1 key ht 800 bkt 0 *flowid 1:1d3a not_in_hw 
  match 0a620002/ffffffff at 12
filter protocol ip pref 2 u32 chain 0 
filter protocol ip pref 2 u32 chain 0 fh 801: ht divisor 1 
filter protocol ip pref 2 u32 chain 0 fh 801::800 order 2048 key ht 801 bkt 0 *flowid 1:b81e not_in_hw 
  match 0a620000/ffff0000 at 16
filter protocol ip pref 3 u32 chain 0 
filter protocol ip pref 3 u32 chain 0 fh 802: ht divisor 1 
filter protocol ip pref 3 u32 chain 0 fh 802::fff order 4095 key ht 802 bkt 0 *flowid 1:ff03 not_in_hw 
  match 00000000/00000000 at 0
`;
