//! JSON with non-finite numbers: report.json writes NaN and ±∞ as the strings `"nan"`, `"inf"`, `"-inf"`
//! (JSON has no such numbers) and reads them back bit for bit.

use anyhow::{Context, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Serialize to pretty JSON, writing non-finite floats as the strings `"inf"`, `"-inf"`, `"nan"`.
pub fn to_json_pretty<T: Serialize + ?Sized>(value: &T) -> Result<String> {
    let mut buf = Vec::new();
    let mut ser = serde_json::Serializer::pretty(&mut buf);
    value
        .serialize(adapter::Ser(&mut ser))
        .context("cannot serialize to JSON")?;
    buf.push(b'\n');
    String::from_utf8(buf).context("serialized JSON is not UTF-8")
}

/// Deserialize JSON written by [`to_json_pretty`]: a float field also accepts `"inf"`, `"-inf"`,
/// `"nan"`. Numbers are parsed exactly (serde_json's `float_roundtrip` feature, enabled in the
/// workspace), so every finite f64 reads back bit for bit.
pub fn from_json<T: DeserializeOwned>(text: &str) -> Result<T> {
    let value = parse_value(text).map_err(|e| anyhow::anyhow!("invalid JSON: {e}"))?;
    from_value(value)
}

/// Parse a JSON document (serde_json, exact floats, nesting limited by serde_json's recursion limit).
pub(crate) fn parse_value(text: &str) -> std::result::Result<serde_json::Value, serde_json::Error> {
    serde_json::from_str(text)
}

pub(crate) fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T> {
    Ok(T::deserialize(adapter::De(value))?)
}

/// A serde adapter that maps non-finite floats to strings and back.
mod adapter {
    use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
    use serde::ser::{self, Serialize, Serializer};
    use serde_json::Value;

    use crate::format::non_finite;

    fn parse_non_finite(s: &str) -> Option<f64> {
        match s {
            "inf" => Some(f64::INFINITY),
            "-inf" => Some(f64::NEG_INFINITY),
            "nan" => Some(f64::NAN),
            _ => None,
        }
    }

    /// Wraps a serializer; every nested value is serialized through the wrapper too.
    pub struct Ser<S>(pub S);

    struct Wrap<'a, T: ?Sized>(&'a T);

    impl<T: ?Sized + Serialize> Serialize for Wrap<'_, T> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            self.0.serialize(Ser(s))
        }
    }

    /// Wraps a compound serializer (seq, map, struct ...).
    pub struct Compound<C>(C);

    macro_rules! forward {
        ($($name:ident($t:ty)),* $(,)?) => {
            $(fn $name(self, v: $t) -> Result<S::Ok, S::Error> { self.0.$name(v) })*
        };
    }

    impl<S: Serializer> Serializer for Ser<S> {
        type Ok = S::Ok;
        type Error = S::Error;
        type SerializeSeq = Compound<S::SerializeSeq>;
        type SerializeTuple = Compound<S::SerializeTuple>;
        type SerializeTupleStruct = Compound<S::SerializeTupleStruct>;
        type SerializeTupleVariant = Compound<S::SerializeTupleVariant>;
        type SerializeMap = Compound<S::SerializeMap>;
        type SerializeStruct = Compound<S::SerializeStruct>;
        type SerializeStructVariant = Compound<S::SerializeStructVariant>;

        forward!(
            serialize_bool(bool),
            serialize_i8(i8),
            serialize_i16(i16),
            serialize_i32(i32),
            serialize_i64(i64),
            serialize_i128(i128),
            serialize_u8(u8),
            serialize_u16(u16),
            serialize_u32(u32),
            serialize_u64(u64),
            serialize_u128(u128),
            serialize_char(char),
            serialize_str(&str),
            serialize_bytes(&[u8]),
            serialize_unit_struct(&'static str),
        );

        fn serialize_f32(self, v: f32) -> Result<S::Ok, S::Error> {
            match non_finite(f64::from(v)) {
                Some(s) => self.0.serialize_str(s),
                None => self.0.serialize_f32(v),
            }
        }
        fn serialize_f64(self, v: f64) -> Result<S::Ok, S::Error> {
            match non_finite(v) {
                Some(s) => self.0.serialize_str(s),
                None => self.0.serialize_f64(v),
            }
        }
        fn serialize_none(self) -> Result<S::Ok, S::Error> {
            self.0.serialize_none()
        }
        fn serialize_some<T: ?Sized + Serialize>(self, v: &T) -> Result<S::Ok, S::Error> {
            self.0.serialize_some(&Wrap(v))
        }
        fn serialize_unit(self) -> Result<S::Ok, S::Error> {
            self.0.serialize_unit()
        }
        fn serialize_unit_variant(
            self,
            name: &'static str,
            i: u32,
            variant: &'static str,
        ) -> Result<S::Ok, S::Error> {
            self.0.serialize_unit_variant(name, i, variant)
        }
        fn serialize_newtype_struct<T: ?Sized + Serialize>(
            self,
            name: &'static str,
            v: &T,
        ) -> Result<S::Ok, S::Error> {
            self.0.serialize_newtype_struct(name, &Wrap(v))
        }
        fn serialize_newtype_variant<T: ?Sized + Serialize>(
            self,
            name: &'static str,
            i: u32,
            variant: &'static str,
            v: &T,
        ) -> Result<S::Ok, S::Error> {
            self.0.serialize_newtype_variant(name, i, variant, &Wrap(v))
        }
        fn serialize_seq(self, len: Option<usize>) -> Result<Self::SerializeSeq, S::Error> {
            self.0.serialize_seq(len).map(Compound)
        }
        fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, S::Error> {
            self.0.serialize_tuple(len).map(Compound)
        }
        fn serialize_tuple_struct(
            self,
            name: &'static str,
            len: usize,
        ) -> Result<Self::SerializeTupleStruct, S::Error> {
            self.0.serialize_tuple_struct(name, len).map(Compound)
        }
        fn serialize_tuple_variant(
            self,
            name: &'static str,
            i: u32,
            variant: &'static str,
            len: usize,
        ) -> Result<Self::SerializeTupleVariant, S::Error> {
            self.0
                .serialize_tuple_variant(name, i, variant, len)
                .map(Compound)
        }
        fn serialize_map(self, len: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
            self.0.serialize_map(len).map(Compound)
        }
        fn serialize_struct(
            self,
            name: &'static str,
            len: usize,
        ) -> Result<Self::SerializeStruct, S::Error> {
            self.0.serialize_struct(name, len).map(Compound)
        }
        fn serialize_struct_variant(
            self,
            name: &'static str,
            i: u32,
            variant: &'static str,
            len: usize,
        ) -> Result<Self::SerializeStructVariant, S::Error> {
            self.0
                .serialize_struct_variant(name, i, variant, len)
                .map(Compound)
        }
        fn is_human_readable(&self) -> bool {
            self.0.is_human_readable()
        }
    }

    impl<C: ser::SerializeSeq> ser::SerializeSeq for Compound<C> {
        type Ok = C::Ok;
        type Error = C::Error;
        fn serialize_element<T: ?Sized + Serialize>(&mut self, v: &T) -> Result<(), C::Error> {
            self.0.serialize_element(&Wrap(v))
        }
        fn end(self) -> Result<C::Ok, C::Error> {
            self.0.end()
        }
    }

    impl<C: ser::SerializeTuple> ser::SerializeTuple for Compound<C> {
        type Ok = C::Ok;
        type Error = C::Error;
        fn serialize_element<T: ?Sized + Serialize>(&mut self, v: &T) -> Result<(), C::Error> {
            self.0.serialize_element(&Wrap(v))
        }
        fn end(self) -> Result<C::Ok, C::Error> {
            self.0.end()
        }
    }

    impl<C: ser::SerializeTupleStruct> ser::SerializeTupleStruct for Compound<C> {
        type Ok = C::Ok;
        type Error = C::Error;
        fn serialize_field<T: ?Sized + Serialize>(&mut self, v: &T) -> Result<(), C::Error> {
            self.0.serialize_field(&Wrap(v))
        }
        fn end(self) -> Result<C::Ok, C::Error> {
            self.0.end()
        }
    }

    impl<C: ser::SerializeTupleVariant> ser::SerializeTupleVariant for Compound<C> {
        type Ok = C::Ok;
        type Error = C::Error;
        fn serialize_field<T: ?Sized + Serialize>(&mut self, v: &T) -> Result<(), C::Error> {
            self.0.serialize_field(&Wrap(v))
        }
        fn end(self) -> Result<C::Ok, C::Error> {
            self.0.end()
        }
    }

    impl<C: ser::SerializeMap> ser::SerializeMap for Compound<C> {
        type Ok = C::Ok;
        type Error = C::Error;
        fn serialize_key<T: ?Sized + Serialize>(&mut self, k: &T) -> Result<(), C::Error> {
            self.0.serialize_key(&Wrap(k))
        }
        fn serialize_value<T: ?Sized + Serialize>(&mut self, v: &T) -> Result<(), C::Error> {
            self.0.serialize_value(&Wrap(v))
        }
        fn end(self) -> Result<C::Ok, C::Error> {
            self.0.end()
        }
    }

    impl<C: ser::SerializeStruct> ser::SerializeStruct for Compound<C> {
        type Ok = C::Ok;
        type Error = C::Error;
        fn serialize_field<T: ?Sized + Serialize>(
            &mut self,
            key: &'static str,
            v: &T,
        ) -> Result<(), C::Error> {
            self.0.serialize_field(key, &Wrap(v))
        }
        fn skip_field(&mut self, key: &'static str) -> Result<(), C::Error> {
            self.0.skip_field(key)
        }
        fn end(self) -> Result<C::Ok, C::Error> {
            self.0.end()
        }
    }

    impl<C: ser::SerializeStructVariant> ser::SerializeStructVariant for Compound<C> {
        type Ok = C::Ok;
        type Error = C::Error;
        fn serialize_field<T: ?Sized + Serialize>(
            &mut self,
            key: &'static str,
            v: &T,
        ) -> Result<(), C::Error> {
            self.0.serialize_field(key, &Wrap(v))
        }
        fn skip_field(&mut self, key: &'static str) -> Result<(), C::Error> {
            self.0.skip_field(key)
        }
        fn end(self) -> Result<C::Ok, C::Error> {
            self.0.end()
        }
    }

    /// Deserializes from a `serde_json::Value`; a float asked for where the JSON holds `"inf"`, `"-inf"`
    /// or `"nan"` reads as that number. Nested values go through the wrapper too.
    pub struct De(pub Value);

    impl<'de> de::Deserializer<'de> for De {
        type Error = serde_json::Error;

        fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            match self.0 {
                Value::Array(a) => {
                    let len = a.len();
                    let mut seq = Seq(a.into_iter());
                    let v = visitor.visit_seq(&mut seq)?;
                    if seq.0.len() == 0 {
                        Ok(v)
                    } else {
                        Err(de::Error::invalid_length(
                            len,
                            &"fewer elements in the array",
                        ))
                    }
                }
                Value::Object(m) => visitor.visit_map(Map {
                    it: m.into_iter(),
                    value: None,
                }),
                other => other.deserialize_any(visitor),
            }
        }

        fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            if let Value::String(s) = &self.0 {
                if let Some(x) = parse_non_finite(s) {
                    return visitor.visit_f64(x);
                }
            }
            self.deserialize_any(visitor)
        }

        fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            self.deserialize_f64(visitor)
        }

        fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            match self.0 {
                Value::Null => visitor.visit_none(),
                other => visitor.visit_some(De(other)),
            }
        }

        fn deserialize_newtype_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            visitor: V,
        ) -> Result<V::Value, Self::Error> {
            visitor.visit_newtype_struct(self)
        }

        fn deserialize_enum<V: Visitor<'de>>(
            self,
            name: &'static str,
            variants: &'static [&'static str],
            visitor: V,
        ) -> Result<V::Value, Self::Error> {
            // Enums in reports are unit variants (Phase); their content needs no float mapping.
            self.0.deserialize_enum(name, variants, visitor)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 char str string bytes byte_buf unit unit_struct
            seq tuple tuple_struct map struct identifier ignored_any
        }
    }

    struct Seq(std::vec::IntoIter<Value>);

    impl<'de> SeqAccess<'de> for Seq {
        type Error = serde_json::Error;
        fn next_element_seed<T: DeserializeSeed<'de>>(
            &mut self,
            seed: T,
        ) -> Result<Option<T::Value>, Self::Error> {
            match self.0.next() {
                Some(v) => seed.deserialize(De(v)).map(Some),
                None => Ok(None),
            }
        }
        fn size_hint(&self) -> Option<usize> {
            Some(self.0.len())
        }
    }

    struct Map {
        it: serde_json::map::IntoIter,
        value: Option<Value>,
    }

    impl<'de> MapAccess<'de> for Map {
        type Error = serde_json::Error;
        fn next_key_seed<K: DeserializeSeed<'de>>(
            &mut self,
            seed: K,
        ) -> Result<Option<K::Value>, Self::Error> {
            match self.it.next() {
                Some((k, v)) => {
                    self.value = Some(v);
                    seed.deserialize(De(Value::String(k))).map(Some)
                }
                None => Ok(None),
            }
        }
        fn next_value_seed<V: DeserializeSeed<'de>>(
            &mut self,
            seed: V,
        ) -> Result<V::Value, Self::Error> {
            let v = self
                .value
                .take()
                .ok_or_else(|| de::Error::custom("a map value is missing"))?;
            seed.deserialize(De(v))
        }
        fn size_hint(&self) -> Option<usize> {
            Some(self.it.len())
        }
    }
}
