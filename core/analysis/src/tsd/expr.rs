//! Symbolic values for the x86-64 analysis: what a register holds in terms
//! of the function's inputs, simplified the way upstream's expression
//! package simplifies them (sums flattened with their constants folded
//! last, products of a sum distributed, zero-extensions collapsed), and
//! patterns with captures to recognise the shapes of the result.
//!
//! Values are shared (`Rc`), and every value knows its size in nodes: a
//! value larger than [`MAX_NODES`] becomes [`Name::Opaque`], which matches
//! nothing, so hostile code (`add rax, rax` a thousand times) cannot make
//! the analysis exponential.

use std::rc::Rc;

/// Values larger than this are replaced by an opaque one.
pub(crate) const MAX_NODES: u32 = 512;

/// A value that is not computed from others: an input register, the
/// function's own address, or something too large to follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Name {
    /// The register's value when the function was entered.
    Input(u8),
    /// The address the code is loaded at.
    Code,
    /// Too large to keep; never matches.
    Opaque,
}

/// A memory operand's segment override, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Segment {
    None,
    Fs,
    Gs,
    Other,
}

#[derive(Debug)]
enum Node {
    Imm(u64),
    Named(Name),
    Add(Vec<Expr>),
    Mul(Vec<Expr>),
    Extend { value: Expr, bits: u8, signed: bool },
    Mem { segment: Segment, at: Expr },
}

/// A symbolic 64-bit value.
#[derive(Clone, Debug)]
pub(crate) struct Expr {
    node: Rc<Node>,
    size: u32,
}

impl Expr {
    fn new(node: Node, size: u32) -> Self {
        if size > MAX_NODES {
            return Self::named(Name::Opaque);
        }
        Self {
            node: Rc::new(node),
            size,
        }
    }

    pub(crate) fn imm(value: u64) -> Self {
        Self::new(Node::Imm(value), 1)
    }

    pub(crate) fn named(name: Name) -> Self {
        Self {
            node: Rc::new(Node::Named(name)),
            size: 1,
        }
    }

    pub(crate) fn as_imm(&self) -> Option<u64> {
        match *self.node {
            Node::Imm(v) => Some(v),
            _ => None,
        }
    }

    fn size_of(parts: &[Expr]) -> u32 {
        parts.iter().fold(1u32, |n, e| n.saturating_add(e.size))
    }

    /// The sum of `parts`: nested sums flattened, constants folded into
    /// one, which goes last and is left out when it is zero.
    pub(crate) fn add(parts: &[Expr]) -> Self {
        let mut operands = Vec::new();
        let mut constant = 0u64;
        for part in parts {
            match &*part.node {
                Node::Add(inner) => {
                    for e in inner {
                        match e.as_imm() {
                            Some(v) => constant = constant.wrapping_add(v),
                            None => operands.push(e.clone()),
                        }
                    }
                }
                Node::Imm(v) => constant = constant.wrapping_add(*v),
                _ => operands.push(part.clone()),
            }
            if operands.len() as u32 > MAX_NODES {
                return Self::named(Name::Opaque);
            }
        }
        if operands.is_empty() {
            return Self::imm(constant);
        }
        if constant != 0 {
            operands.push(Self::imm(constant));
        }
        if operands.len() == 1 {
            return operands.swap_remove(0);
        }
        let size = Self::size_of(&operands);
        Self::new(Node::Add(operands), size)
    }

    /// The product of `parts`: constants folded (last, left out when one),
    /// zero absorbing, and `(a + b) * c` distributed into `a*c + b*c`.
    pub(crate) fn mul(parts: &[Expr]) -> Self {
        let mut operands = Vec::new();
        let mut constant = 1u64;
        for part in parts {
            match part.as_imm() {
                Some(0) => return Self::imm(0),
                Some(1) => {}
                Some(v) => constant = constant.wrapping_mul(v),
                None => operands.push(part.clone()),
            }
        }
        if operands.is_empty() {
            return Self::imm(constant);
        }
        if constant != 1 {
            operands.push(Self::imm(constant));
        }
        if operands.len() == 1 {
            return operands.swap_remove(0);
        }
        if operands.len() == 2 {
            if let Node::Add(terms) = &*operands[0].node {
                let factor = &operands[1];
                let products: Vec<Expr> = terms
                    .iter()
                    .map(|t| Self::mul(&[t.clone(), factor.clone()]))
                    .collect();
                return Self::add(&products);
            }
        }
        let size = Self::size_of(&operands);
        Self::new(Node::Mul(operands), size)
    }

    /// The low `bits` of `value`, zero-extended.
    pub(crate) fn zero_extend(value: Expr, bits: u8) -> Self {
        if bits >= 64 {
            return value;
        }
        if bits == 0 {
            return Self::imm(0);
        }
        match &*value.node {
            Node::Imm(v) => Self::imm(v & ((1u64 << bits) - 1)),
            Node::Extend {
                value: inner,
                bits: b,
                signed: false,
            } => {
                if *b <= bits {
                    value.clone()
                } else {
                    let size = inner.size.saturating_add(1);
                    Self::new(
                        Node::Extend {
                            value: inner.clone(),
                            bits,
                            signed: false,
                        },
                        size,
                    )
                }
            }
            _ => {
                let size = value.size.saturating_add(1);
                Self::new(
                    Node::Extend {
                        value,
                        bits,
                        signed: false,
                    },
                    size,
                )
            }
        }
    }

    /// The low `bits` of `value`, sign-extended (never simplified).
    pub(crate) fn sign_extend(value: Expr, bits: u8) -> Self {
        let size = value.size.saturating_add(1);
        Self::new(
            Node::Extend {
                value,
                bits,
                signed: true,
            },
            size,
        )
    }

    /// What memory holds at `at` (the access size does not matter to the
    /// patterns, so it is not kept).
    pub(crate) fn mem(segment: Segment, at: Expr) -> Self {
        let size = at.size.saturating_add(1);
        Self::new(Node::Mem { segment, at }, size)
    }

    /// Sort rank of a value among a sum's or product's operands, as
    /// upstream orders them before comparing with a pattern.
    fn rank(&self) -> u8 {
        match &*self.node {
            Node::Extend { .. } => 0,
            Node::Mem { .. } => 1,
            Node::Add(_) | Node::Mul(_) => 2,
            Node::Named(_) => 3,
            Node::Imm(_) => 5,
        }
    }

    /// Whether this value has the shape of `pattern`; immediates under a
    /// [`Pat::Capture`] are recorded in `captures`.
    pub(crate) fn matches(&self, pattern: &Pat, captures: &mut [u64]) -> bool {
        match (&*self.node, pattern) {
            (Node::Imm(v), Pat::Imm(w)) => v == w,
            (Node::Imm(v), Pat::Capture(slot)) => match captures.get_mut(*slot) {
                Some(c) => {
                    *c = *v;
                    true
                }
                None => false,
            },
            (Node::Named(n), Pat::Named(m)) => *n != Name::Opaque && n == m,
            (Node::Add(ops), Pat::Add(pats)) | (Node::Mul(ops), Pat::Mul(pats)) => {
                Self::operands_match(ops, pats, captures)
            }
            (
                Node::Extend {
                    value,
                    bits,
                    signed: false,
                },
                Pat::ZeroExtend(inner, b),
            ) => bits == b && value.matches(inner, captures),
            (Node::Mem { segment, at }, Pat::Mem(s, inner)) => {
                segment == s && at.matches(inner, captures)
            }
            _ => false,
        }
    }

    /// Operands compared pairwise after a stable sort by rank on both
    /// sides (upstream's rule: no search over permutations).
    fn operands_match(ops: &[Expr], pats: &[Pat], captures: &mut [u64]) -> bool {
        if ops.len() != pats.len() {
            return false;
        }
        let mut ops: Vec<&Expr> = ops.iter().collect();
        let mut pats: Vec<&Pat> = pats.iter().collect();
        ops.sort_by_key(|e| e.rank());
        pats.sort_by_key(|p| p.rank());
        ops.iter().zip(pats).all(|(e, p)| e.matches(p, captures))
    }
}

/// A shape to recognise.
#[derive(Clone, Debug)]
pub(crate) enum Pat {
    Imm(u64),
    /// Any immediate, recorded in the given slot.
    Capture(usize),
    Named(Name),
    Add(Vec<Pat>),
    Mul(Vec<Pat>),
    ZeroExtend(Box<Pat>, u8),
    Mem(Segment, Box<Pat>),
}

impl Pat {
    fn rank(&self) -> u8 {
        match self {
            Pat::ZeroExtend(..) => 0,
            Pat::Mem(..) => 1,
            Pat::Add(_) | Pat::Mul(_) => 2,
            Pat::Named(_) => 3,
            Pat::Capture(_) => 4,
            Pat::Imm(_) => 5,
        }
    }

    pub(crate) fn mem(segment: Segment, at: Pat) -> Self {
        Pat::Mem(segment, Box::new(at))
    }

    pub(crate) fn zext32(inner: Pat) -> Self {
        Pat::ZeroExtend(Box::new(inner), 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rdi() -> Expr {
        Expr::named(Name::Input(7))
    }

    #[test]
    fn sums_flatten_and_fold_constants_last() {
        let inner = Expr::add(&[rdi(), Expr::imm(8)]);
        let sum = Expr::add(&[Expr::imm(0x10), inner, Expr::imm(0)]);
        let mut caps = [0u64; 1];
        let pat = Pat::Add(vec![Pat::Named(Name::Input(7)), Pat::Capture(0)]);
        assert!(sum.matches(&pat, &mut caps));
        assert_eq!(caps[0], 0x18);
        assert_eq!(Expr::add(&[Expr::imm(2), Expr::imm(3)]).as_imm(), Some(5));
        assert!(Expr::add(&[rdi(), Expr::imm(0)]).matches(&Pat::Named(Name::Input(7)), &mut caps));
    }

    #[test]
    fn a_product_of_a_sum_is_distributed() {
        let sum = Expr::add(&[rdi(), Expr::imm(0x31)]);
        let product = Expr::mul(&[sum, Expr::imm(16)]);
        let mut caps = [0u64; 2];
        let pat = Pat::Add(vec![
            Pat::Mul(vec![Pat::Named(Name::Input(7)), Pat::Capture(0)]),
            Pat::Capture(1),
        ]);
        assert!(product.matches(&pat, &mut caps));
        assert_eq!(caps, [16, 0x310]);
        assert_eq!(Expr::mul(&[rdi(), Expr::imm(0)]).as_imm(), Some(0));
        assert!(Expr::mul(&[rdi(), Expr::imm(1)]).matches(&Pat::Named(Name::Input(7)), &mut caps));
    }

    #[test]
    fn zero_extensions_collapse() {
        let once = Expr::zero_extend(rdi(), 32);
        let twice = Expr::zero_extend(once, 32);
        let mut caps = [];
        assert!(twice.matches(&Pat::zext32(Pat::Named(Name::Input(7))), &mut caps));
        let wider = Expr::zero_extend(Expr::zero_extend(rdi(), 8), 32);
        assert!(wider.matches(
            &Pat::ZeroExtend(Box::new(Pat::Named(Name::Input(7))), 8),
            &mut caps
        ));
        assert_eq!(
            Expr::zero_extend(Expr::imm(u64::MAX), 32).as_imm(),
            Some(0xffff_ffff)
        );
        let signed = Expr::zero_extend(Expr::sign_extend(rdi(), 32), 32);
        assert!(!signed.matches(&Pat::zext32(Pat::Named(Name::Input(7))), &mut caps));
    }

    #[test]
    fn operand_order_is_by_kind_not_by_search() {
        let m = Expr::mem(Segment::Fs, Expr::imm(0x10));
        let sum = Expr::add(&[Expr::mul(&[rdi(), Expr::imm(8)]), m]);
        let pat = Pat::Add(vec![
            Pat::mem(Segment::Fs, Pat::Imm(0x10)),
            Pat::Mul(vec![Pat::Named(Name::Input(7)), Pat::Capture(0)]),
        ]);
        let mut caps = [0u64; 1];
        assert!(sum.matches(&pat, &mut caps));
        assert_eq!(caps[0], 8);
        // Another segment is another value.
        let gs = Expr::add(&[
            Expr::mul(&[rdi(), Expr::imm(8)]),
            Expr::mem(Segment::Gs, Expr::imm(0x10)),
        ]);
        assert!(!gs.matches(&pat, &mut caps));
    }

    #[test]
    fn growth_is_bounded() {
        let mut v = rdi();
        for _ in 0..10_000 {
            v = Expr::add(&[v.clone(), v]);
        }
        assert!(v.size <= MAX_NODES);
        let mut caps = [];
        assert!(!v.matches(&Pat::Named(Name::Opaque), &mut caps));
        let mut w = rdi();
        for _ in 0..10_000 {
            w = Expr::mem(Segment::None, w);
        }
        assert!(w.size <= MAX_NODES);
    }
}
