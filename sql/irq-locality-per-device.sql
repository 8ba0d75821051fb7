-- irq-locality-per-device: share of each device's interrupts serviced on its own NUMA node.
--
-- interrupts holds per-IRQ counts reduced to the node whose CPUs serviced them; each
-- IRQ's home node and PCI function come from host_facts (irq/<irq>/device_node and
-- irq/<irq>/pci), and the device name from the nic/nvme facts with that PCI address
-- (else the address). locality = interrupts on the home node / all interrupts of the
-- device (1.0 = all local). IRQs serviced on the far node (irq_locality_miss) show as a
-- low locality. Worst first.
--
-- @param max_locality float = 1.0  only devices at or below this locality
WITH irq_home AS (
    SELECT host, device AS irq, max(value_num) AS home_node
    FROM host_facts
    WHERE category = 'irq' AND key = 'device_node'
    GROUP BY host, device
),
irq_pci AS (
    SELECT host, device AS irq, lower(max(value)) AS pci
    FROM host_facts
    WHERE category = 'irq' AND key = 'pci'
    GROUP BY host, device
),
dev_name AS (
    SELECT host, lower(value) AS pci, min(device) AS name
    FROM host_facts
    WHERE category IN ('nic', 'nvme') AND key = 'pci'
    GROUP BY host, lower(value)
),
per_device AS (
    SELECT
        i.host,
        coalesce(p.pci, i.device) AS pci,
        count(DISTINCT i.irq) AS irqs,
        min(h.home_node) AS home_node,
        sum(coalesce(i.count, 0)) AS interrupts,
        sum(CASE WHEN cast(i.node AS double) = h.home_node THEN coalesce(i.count, 0) ELSE 0 END) AS local_interrupts
    FROM interrupts AS i
    JOIN irq_home AS h ON i.host = h.host AND i.irq = h.irq
    LEFT JOIN irq_pci AS p ON i.host = p.host AND i.irq = p.irq
    GROUP BY i.host, coalesce(p.pci, i.device)
)
SELECT d.host, coalesce(n.name, d.pci) AS device, d.pci, d.irqs, d.home_node, d.interrupts, d.local_interrupts,
       round(cast(d.local_interrupts AS double) / cast(d.interrupts AS double), 4) AS locality
FROM per_device AS d
LEFT JOIN dev_name AS n ON d.host = n.host AND d.pci = n.pci
WHERE d.interrupts > 0
  AND cast(d.local_interrupts AS double) / cast(d.interrupts AS double) <= :max_locality
ORDER BY locality, d.interrupts DESC, d.host, device
