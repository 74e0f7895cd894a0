//! Language identification for `language:response_language` and the two `change_case:english_*`
//! checks, in place of the reference's Python `langdetect`.
//!
//! `whatlang` (trigram and script based, deterministic) restricted to the languages `langdetect`
//! can answer, and its ISO 639-3 answers mapped to the ISO 639-1 codes `langdetect` returns. Where
//! the two disagree: `langdetect` is random unless seeded (its answer on a short or mixed text can
//! change between runs; ours never does), and the two models differ on short, mixed-language and
//! closely related languages (e.g. `no`/`da`, `hr`/`sl`, `hi`/`mr`). `whatlang` has no Swahili
//! (`sw`), one of langdetect's languages: a reference asking for it is refused, not guessed.

use std::sync::OnceLock;

use whatlang::{Detector, Lang};

/// langdetect's code for each whatlang language both know.
const CODES: &[(Lang, &str)] = &[
    (Lang::Afr, "af"),
    (Lang::Ara, "ar"),
    (Lang::Bul, "bg"),
    (Lang::Ben, "bn"),
    (Lang::Cat, "ca"),
    (Lang::Ces, "cs"),
    (Lang::Cym, "cy"),
    (Lang::Dan, "da"),
    (Lang::Deu, "de"),
    (Lang::Ell, "el"),
    (Lang::Eng, "en"),
    (Lang::Spa, "es"),
    (Lang::Est, "et"),
    (Lang::Pes, "fa"),
    (Lang::Fin, "fi"),
    (Lang::Fra, "fr"),
    (Lang::Guj, "gu"),
    (Lang::Heb, "he"),
    (Lang::Hin, "hi"),
    (Lang::Hrv, "hr"),
    (Lang::Hun, "hu"),
    (Lang::Ind, "id"),
    (Lang::Ita, "it"),
    (Lang::Jpn, "ja"),
    (Lang::Kan, "kn"),
    (Lang::Kor, "ko"),
    (Lang::Lit, "lt"),
    (Lang::Lav, "lv"),
    (Lang::Mkd, "mk"),
    (Lang::Mal, "ml"),
    (Lang::Mar, "mr"),
    (Lang::Nep, "ne"),
    (Lang::Nld, "nl"),
    (Lang::Nob, "no"),
    (Lang::Pan, "pa"),
    (Lang::Pol, "pl"),
    (Lang::Por, "pt"),
    (Lang::Ron, "ro"),
    (Lang::Rus, "ru"),
    (Lang::Slk, "sk"),
    (Lang::Slv, "sl"),
    (Lang::Swe, "sv"),
    (Lang::Tam, "ta"),
    (Lang::Tel, "te"),
    (Lang::Tha, "th"),
    (Lang::Tgl, "tl"),
    (Lang::Tur, "tr"),
    (Lang::Ukr, "uk"),
    (Lang::Urd, "ur"),
    (Lang::Vie, "vi"),
    (Lang::Cmn, "zh-cn"),
];

/// Codes langdetect can return that whatlang cannot: refused with a reason.
const UNSUPPORTED: &[&str] = &["sw", "so", "sq", "zh-tw"];

fn detector() -> &'static Detector {
    static DETECTOR: OnceLock<Detector> = OnceLock::new();
    DETECTOR.get_or_init(|| Detector::with_allowlist(CODES.iter().map(|(lang, _)| *lang).collect()))
}

/// Whether `code` is a language this module can recognise; `Err` says why not.
pub fn check_code(code: &str) -> Result<(), String> {
    if CODES.iter().any(|(_, known)| *known == code) {
        Ok(())
    } else if UNSUPPORTED.contains(&code) {
        Err(format!("{code:?} is a langdetect language this verifier's detector (whatlang) cannot identify"))
    } else {
        let known: Vec<&str> = CODES.iter().map(|(_, code)| *code).collect();
        Err(format!("expected an ISO 639-1 code langdetect uses, one of {}, got {code:?}", known.join(" ")))
    }
}

/// The language of `text` as a langdetect code, or `None` when the text holds nothing to go on
/// (no letters), where langdetect raises and IFEval counts the instruction as followed.
pub fn detect(text: &str) -> Option<&'static str> {
    let info = detector().detect(text)?;
    CODES.iter().find(|(lang, _)| *lang == info.lang()).map(|(_, code)| *code)
}

/// Builds the detector's tables now rather than on the first item.
pub fn warm_up() {
    detector();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_the_ifeval_languages_on_plain_sentences() {
        let cases: &[(&str, Option<&str>)] = &[
            ("The quick brown fox jumps over the lazy dog and runs away into the forest.", Some("en")),
            ("THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG AND RUNS AWAY INTO THE FOREST.", Some("en")),
            ("El rápido zorro marrón salta sobre el perro perezoso y corre hacia el bosque.", Some("es")),
            ("Le renard brun rapide saute par-dessus le chien paresseux et court dans la forêt.", Some("fr")),
            ("Der schnelle braune Fuchs springt über den faulen Hund und läuft in den Wald.", Some("de")),
            ("Быстрая коричневая лиса прыгает через ленивую собаку и убегает в лес.", Some("ru")),
            ("तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है और जंगल में भाग जाती है।", Some("hi")),
            ("素早い茶色の狐はのろまな犬を飛び越えて森の中へ走っていった。", Some("ja")),
            ("빠른 갈색 여우가 게으른 개를 뛰어넘어 숲으로 달려간다.", Some("ko")),
            ("12345 !!! ---", None),
            ("", None),
        ];
        for (text, expected) in cases {
            assert_eq!(detect(text), *expected, "{text:?}");
        }
    }

    #[test]
    fn codes_are_checked() {
        assert!(check_code("en").is_ok());
        assert!(check_code("sw").unwrap_err().contains("cannot identify"));
        assert!(check_code("english").unwrap_err().starts_with("expected an ISO 639-1 code"));
    }
}
